"""What the entry scripts share: turning predictable mistakes into one-line messages."""

from __future__ import annotations

import os
import sys
from typing import Callable

EXIT_USAGE = 2  # bad config, missing input: nothing was done


def run_main(main: Callable[[list[str] | None], int]) -> None:
    """Call `main`; a user error becomes `error: ...` on stderr and exit code 2, not a traceback."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        sys.exit(main(None))
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        if os.environ.get("PIPELINE_DEBUG"):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
