"""What every data stage shares: the result it returns and the context it runs in."""

from __future__ import annotations

import contextlib
import hashlib
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


class LocalEngine:
    """How the stages move data by default: batches in this process, or in `num_proc` processes
    where a stage fans out (clean's map, MinHash signatures). The Ray engine (engine_ray.py) has
    the same methods; a stage calls them with the same per-batch functions, so the two engines
    differ in where a batch is computed, never in what it becomes."""

    name = "local"

    def __init__(self, num_proc: int = 1):
        self.num_proc = num_proc

    def map_batches(self, ds: Any, fn: Any, added: dict, *, min_rows_per_proc: int = 0, **kwargs: Any) -> Any:
        """`map_batches` below; in up to num_proc processes (one per `min_rows_per_proc` rows) when given."""
        procs = min(self.num_proc, ds.num_rows // min_rows_per_proc) if min_rows_per_proc and self.num_proc > 1 else 1
        return map_batches(ds, fn, added, **({"num_proc": procs} if procs > 1 else {}), **kwargs)

    def stage(self, tmp: Path) -> contextlib.AbstractContextManager:
        """While a stage runs in its temporary folder `tmp`: nothing to set up here (Ray's maps write there)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------ reductions and filtered maps
    # (the Ray engine's versions run in tasks over blocks; see its `reduce` and `map_filter`)
    def reduce(self, ds: Any, fn: Any, combine: Any, columns: list[str], **_: Any) -> Any:
        """combine([fn(table)]): `fn` given `ds`'s `columns` as one pyarrow Table, here in one piece
        (on Ray one partial per batch and block, combined in row order: `fn` and `combine` must give
        the same answer however the rows are cut)."""
        return combine([fn(ds.select_columns(columns).with_format("arrow")[:])])

    def map_filter(self, ds: Any, fn: Any, added: dict, keep: Any, *, drop: list[str], tally: Any, combine: Any,
                   **kwargs: Any) -> tuple[Any, Any]:
        """(`ds` mapped by `fn` as `map_batches` maps it, less the rows where keep(table) is false and
        less the columns `drop`; combine([tally(table)])), `keep` and `tally` given the mapped rows as
        a pyarrow Table: an in-memory Arrow filter of the mapped table, here. keep=None keeps every row:
        the mapped Dataset itself less `drop` (datasets drops them lazily; nothing is copied)."""
        import datasets

        mapped = self.map_batches(ds, fn, added, **kwargs)
        table = mapped.with_format("arrow")[:]
        partial = combine([tally(table)])
        if keep is None:
            return mapped.remove_columns(drop) if drop else mapped, partial
        return datasets.Dataset(table.filter(keep(table)).drop_columns(drop)), partial

    @staticmethod
    def load_source(path: Path, cfg: Any, where: str, read_whole: Any) -> tuple:
        """The load stage's read of a source file or folder: `read_whole` (sources.read_source, handed
        in by the stage as map_batches's `fn` is, so this module imports no stage), in this process."""
        return read_whole(path, cfg, where)

    @staticmethod
    def save(data: Any, folder: Path) -> None:
        """save_to_disk, with one shard for each empty dataset: datasets writes zero shards for one,
        and load_from_disk then fails (IndexError) on the folder it wrote itself."""
        if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
            data.save_to_disk(str(folder), num_shards=1 if data.num_rows == 0 else None)
        else:
            data.save_to_disk(str(folder), num_shards={k: 1 for k, d in data.items() if d.num_rows == 0})


    # ------------------------------------------------------------ dedup and the leakage check
    # (the stage hands in its in-process code, as load_source's read_whole: this module imports no stage)
    def dedup(self, ds: Any, cfg: Any, splits: Any, report: Path, local: Any) -> tuple:
        """The dedup stage's work on `ds` (kept rows, drops, stats, test split counts; the report
        written to `report`): local (dedup.dedup_lists) on the columns as lists, in this process."""
        return local(ds, cfg, splits, report, self.num_proc)

    def cross_duplicates(self, reference: Any, query: Any, cfg: Any, threshold: float, find: Any) -> list:
        """find (minhash.cross_duplicates: a MinHashLSH index of the reference's) on the two datasets'
        texts as lists, in this process."""
        return find(column(reference, "text"), column(query, "text"), cfg, threshold, self.num_proc)

    # ------------------------------------------------------------ split's rows (the Ray engine's: ray_split.py)
    def split_rows(self, ds: Any, cfg: Any, split_local: Any) -> tuple[dict, bool]:
        """split_local (split.split_rows, handed in as dedup's local way is): every row's split code
        here, then a select of each split's rows."""
        return split_local(ds, cfg, self)

    @staticmethod
    def drop_rows(ds: Any, rows: list[int]) -> Any:
        """`ds` without `rows` (ascending): a select of the others (a list: the fingerprint as before)."""
        import numpy as np

        keep = np.ones(ds.num_rows, dtype=bool)
        keep[rows] = False
        return ds.select(np.flatnonzero(keep).tolist())


@dataclass
class StageContext:
    out_dir: Path  # the stage's (temporary) directory, for side files such as reports
    num_proc: int = 1  # prepare.num_proc: processes of the local engine
    progress: bool = True
    engine: Any = None  # LocalEngine (None: a local one with num_proc) or engine_ray.RayEngine
    similarity: Any = None  # split: the DedupConfig whose MinHash settings the leakage check shares

    def __post_init__(self):
        if self.engine is None:
            self.engine = LocalEngine(self.num_proc)


def num_rows(data: Any) -> int:
    """Rows of a Dataset, or summed over the splits of a DatasetDict."""
    if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
        return data.num_rows
    return sum(d.num_rows for d in data.values())


def column(ds: Any, name: str) -> list:
    """A column as a Python list. `ds[name]` alone is a lazy Column in datasets>=4, and indexing it
    row by row costs a table lookup per row (seconds for a few thousand rows)."""
    return ds[name][:]


def unit_hash(seed: int, doc_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, id): a document's place in every sampling decision."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def add_up(partials: list) -> Any:
    """Partials of a reduce added up in order: numbers, Counters (first-seen key order kept), sets
    (united) and tuples of them (element by element)."""
    first, *rest = partials
    if isinstance(first, tuple):
        return tuple(add_up(list(parts)) for parts in zip(*partials))
    for p in rest:
        first = first | p if isinstance(first, set) else first + p
    return first


def concat(partials: list) -> Any:
    """Partials of a reduce that are per-row values (numpy arrays, or tuples of them), joined in row order."""
    import numpy as np

    if isinstance(partials[0], tuple):
        return tuple(concat(list(parts)) for parts in zip(*partials))
    return np.concatenate(partials)


def fetch(engine: Any, ds: Any, rows: list[int], names: tuple[str, ...]) -> tuple[list, ...]:
    """Columns `names` of `ds` at `rows` (ascending), one list each, read where `engine` reduces: only
    those rows (`ds.select(rows)`), never the whole column."""
    import functools

    if not len(rows):
        return tuple([] for _ in names)
    return engine.reduce(ds.select(rows), functools.partial(_lists, names=names), add_up, list(names), desc="fetch")


def _lists(table: Any, names: tuple[str, ...]) -> tuple[list, ...]:
    return tuple(table.column(n).to_pylist() for n in names)


def map_batches(ds: Any, fn: Any, added: dict, **kwargs: Any) -> Any:
    """`ds.map(fn, batched=True, ...)` whose result has the same columns when `ds` is empty.

    On zero rows datasets never calls `fn`, so the columns it adds are missing (with
    remove_columns, every column is): an empty split (split.validation=0) would then differ from
    the others and save as a folder that does not load. `added` maps each column `fn` adds or
    changes to its feature, exactly as datasets infers it for rows.
    """
    if ds.num_rows:
        return ds.map(fn, batched=True, **kwargs)
    from datasets import Dataset, Features

    removed = kwargs.get("remove_columns") or []
    features = Features({**{k: v for k, v in ds.features.items() if k not in removed}, **added})
    return Dataset.from_dict({k: [] for k in features}, features=features)
