"""What every data stage shares: the result it returns and the context it runs in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Column contract between stages:
#   load/clean/dedup: id (str), text (str), label (str, "" when unlabelled), source_split (str, "" when none)
#   split:            a DatasetDict train/validation/test with id, text, label, chunk (int, 0 unless chunked)
#   label:            label becomes an int ClassLabel feature
#   tokenize:         adds input_ids, attention_mask, length (tokens)
SPLITS = ("train", "validation", "test")


@dataclass
class StageResult:
    data: Any  # datasets.Dataset or DatasetDict
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> rows dropped
    stats: dict[str, Any] = field(default_factory=dict)  # anything else worth reporting (JSON-serialisable)


@dataclass
class StageContext:
    out_dir: Path  # the stage's (temporary) directory, for side files such as reports
    num_proc: int = 1
    progress: bool = True


def num_rows(data: Any) -> int:
    """Rows of a Dataset, or summed over the splits of a DatasetDict."""
    if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
        return data.num_rows
    return sum(d.num_rows for d in data.values())
