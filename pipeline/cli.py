"""What the entry scripts share: turning predictable mistakes into one-line messages."""

from __future__ import annotations

import os
import sys
from typing import Callable

EXIT_USAGE = 2  # bad config, missing input: nothing was done
EXIT_CTRL_C = 130  # as a shell reports a process that SIGINT ended


def run_main(main: Callable[[list[str] | None], int]) -> None:
    """Call `main`; a user error becomes `error: ...` on stderr and exit code 2, not a traceback."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        sys.exit(main(None))
    except (ValueError, OSError, KeyError) as e:  # OSError: a path that is a file, unwritable, a full disk
        if os.environ.get("PIPELINE_DEBUG"):
            raise
        print(f"error: {_message(e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:  # Ctrl-C outside train's own handler: what was being written is a temporary
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(EXIT_CTRL_C)


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.strerror:  # from the system, not one of ours: not "[Errno 20] ..."
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e)
