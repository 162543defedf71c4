"""The contract between the stages and the engines that run them, in one place.

A stage is a function `(input, its config section, StageContext) -> StageResult`; the only way it
moves rows is through `ctx.engine`, an `Engine` (below): the local one (local.py) or Ray's
(ray/engine.py). A stage hands the engine its per-batch functions, so the engines differ in where
a batch is computed, never in what it becomes (their outputs are equal, tested). An engine imports
no stage: where a stage needs whole-dataset work (dedup, the leakage check, split's routing, the
load of a source), it hands in its in-process code and the Ray engine runs the same decisions in tasks.

"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

from pipeline.data.engines.local import LocalEngine

# Column contract between stages (the split names and the text column are named once, in ops.py):
#   load/clean/dedup: id (str), text (str), label (str, "" when unlabelled), source_split (str, "" when none)
#   split:            a DatasetDict train/validation/test with id, text, label, chunk (int, 0 unless chunked)
#   label:            label becomes an int ClassLabel feature
#   tokenize:         adds input_ids, attention_mask, length (tokens)


@dataclass
class StageResult:
    data: Any  # datasets.Dataset or DatasetDict
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> rows dropped
    stats: dict[str, Any] = field(default_factory=dict)  # anything else worth reporting (JSON-serialisable)


@dataclass
class Stage:
    """Every stage function has one shape: fn(input, its config section, context) -> StageResult."""

    name: str
    fn: Callable[..., StageResult]  # the stage function; its module's import closure is its code
    section: Any  # its config section, passed to fn
    uses: tuple = ()  # other sections its output depends on (fingerprinted too), reached through the context

    @property
    def config(self) -> tuple:
        """Every setting the stage's output depends on: what its fingerprint covers."""
        return (self.section, *self.uses)

    def run(self, data: Any, ctx: StageContext) -> StageResult:
        return self.fn(data, self.section, ctx)


class StageFailed(RuntimeError):
    """A stage could not finish for a reason that is not the input's (a Ray worker lost for good)."""


class Engine(Protocol):
    """What a stage may ask of an engine. `ds` is a datasets.Dataset; functions are handed in by the
    stage and must give the same answer however the rows are cut into batches or blocks."""

    name: str

    def stage(self, tmp: Path) -> ContextManager:
        """Entered while a stage runs in its temporary folder `tmp`."""

    def map_batches(self, ds: Any, fn: Callable, added: dict, *, min_rows_per_proc: int = 0, **kwargs: Any) -> Any:
        """`ops.map_batches(ds, fn, added, **kwargs)`: `fn` over batches of rows, columns kept on empty input."""

    def reduce(self, ds: Any, fn: Callable, combine: Callable, columns: list[str], **kwargs: Any) -> Any:
        """combine([fn(table) for each piece of `ds`'s `columns`, in row order])."""

    def map_filter(self, ds: Any, fn: Callable, added: dict, keep: Callable | None, *, drop: list[str],
                   tally: Callable, combine: Callable, **kwargs: Any) -> tuple[Any, Any]:
        """(`ds` mapped by `fn`, less the rows keep() rejects and the columns `drop`; combined tallies)."""

    def load_source(self, path: Path, cfg: Any, where: str, read_whole: Callable) -> tuple:
        """The load stage's read of a source: read_whole(path, cfg, where), or the same rows read in parts."""

    def save(self, data: Any, folder: Path) -> None:
        """A Dataset or DatasetDict written as `datasets.save_to_disk` writes it (loadable even when empty)."""

    def dedup(self, ds: Any, cfg: Any, splits: Any, report: Path, local: Callable) -> tuple:
        """The dedup stage's work (kept rows, drops, stats, test split counts; its report written)."""

    def cross_duplicates(self, reference: Any, query: Any, cfg: Any, threshold: float, find: Callable) -> list:
        """Rows of `query` with a near-duplicate in `reference` (the leakage check)."""

    def split_rows(self, ds: Any, cfg: Any, split_local: Callable, stratum: Any = None) -> tuple[dict, bool]:
        """Every row's split, then each split's rows."""

    def drop_rows(self, ds: Any, rows: list[int]) -> Any:
        """`ds` without `rows` (ascending)."""


@dataclass
class StageContext:
    out_dir: Path  # the stage's (temporary) directory, for side files such as reports
    num_proc: int = 1  # prepare.num_proc: processes of the local engine
    progress: bool = True
    engine: Engine = None  # LocalEngine (None: a local one with num_proc) or engine_ray.RayEngine
    similarity: Any = None  # split: the DedupConfig whose MinHash settings the leakage check shares
    # clean: the rows are conversations (pipeline/data/io/conversation.py), cleaned message by message; decided by the
    # source section, which every stage's fingerprint covers through load's
    conversations: bool = False
    # clean, split: the rows are sentence pairs (pipeline/data/io/pair.py): "ordered" or "symmetric" (pair.paired), each
    # side cleaned, a symmetric pair stored in one order, and a pair whose two sides both occur in train reported
    pairs: str = ""
    # split.stratify: (rows, engine) -> a function from a raw label to its stratum (Task.strata); None: the label itself.
    # The task is part of every stage's fingerprint through the prepared data's sections
    strata: Any = None

    def __post_init__(self):
        if self.engine is None:
            self.engine = LocalEngine(self.num_proc)
