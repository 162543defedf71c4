"""Metric modules in the `evaluate` library's format that ship with the package.

`evaluate.load("accuracy")` fetches the metric's script from the hub and fails offline;
`evaluate.load(<local folder>)` does not. Each folder here holds one self-contained module
(scikit-learn does the arithmetic), named like the folder, as `evaluate.load` expects.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

METRICS_DIR = Path(__file__).resolve().parent
NAMES = ("accuracy", "f1", "per_class", "confusion_matrix")


def metric_path(name: str) -> Path:
    """The folder of a packaged metric module, for `evaluate.load(str(path))`."""
    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        raise ValueError(f"no packaged metric '{name}' in {METRICS_DIR}; available: {', '.join(NAMES)}")
    return path


@functools.lru_cache(maxsize=None)
def load(name: str) -> Any:
    """`evaluate.load` of a packaged module, kept in memory (no cache files, no network)."""
    import evaluate

    return evaluate.load(str(metric_path(name)), keep_in_memory=True)
