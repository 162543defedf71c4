"""The local engine: a stage's batches in this process, or in `num_proc` processes where it fans out."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pipeline.data.engines.ops import TEXT, column, map_batches


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
        """The load stage's read of a source file or folder: `read_whole` (load.read_source, handed
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
        return find(column(reference, TEXT), column(query, TEXT), cfg, threshold, self.num_proc)

    # ------------------------------------------------------------ split's rows (the Ray engine's: ray_split.py)
    def split_rows(self, ds: Any, cfg: Any, split_local: Any, stratum: Any = None) -> tuple[dict, bool]:
        """split_local (split.split_rows, handed in as dedup's local way is): every row's split code
        here, then a select of each split's rows; `stratum`: a task's strata of the labels."""
        return split_local(ds, cfg, self, stratum)

    @staticmethod
    def drop_rows(ds: Any, rows: list[int]) -> Any:
        """`ds` without `rows` (ascending): a select of the others (a list: the fingerprint as before)."""
        import numpy as np

        keep = np.ones(ds.num_rows, dtype=bool)
        keep[rows] = False
        return ds.select(np.flatnonzero(keep).tolist())
