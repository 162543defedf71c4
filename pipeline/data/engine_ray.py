"""The Ray engine (prepare.engine=ray): the stages' own functions, run on Ray over Arrow blocks.

What moves and what stays (the engines differ in how they move data, never in what a stage decides):
- Row-wise work (clean, split's chunking, label, tokenize): the stage's per-batch function, the one
  the local engine hands to `datasets.map`, runs in Ray tasks, one per block of `ray.blocks` contiguous
  rows (ray_io.py): each task reads its rows from the stage's files itself (a memory-mapped Dataset
  pickles as its file names, column operations and row indices, not as rows) and writes them, mapped
  and cast to the local engine's features, as one Arrow shard under the stage's temporary folder,
  as save_to_disk's shard writer writes one (ray_io.StageShard; blocks cut as datasets' shard()
  cuts); the map's result is those shards, memory-mapped, in order. `save`: a split that is exactly
  one map's shards (clean, split's chunks, label, tokenize, load) takes them by a rename (each row
  written once); any other (a select, pending column operations) is written by a task per shard
  with datasets' own shard writer; the driver writes only state.json and dataset_info.json (and
  dataset_dict.json). Each file is byte for byte what save_to_disk writes for its rows, the folder
  `save_to_disk(num_shards=blocks)`'s where the blocks are even (tested). Plain Ray tasks rather than Ray
  Data's map_batches: Ray Data neither reads a datasets folder through its indices and column
  operations nor writes datasets' layout, and the stage's rows must not come back to the driver.
- Dedup's facts and strings (ray_dedup.py): per block, a task reads its rows from the stage's files
  and returns a 128-bit hash of each normalized text and its length; ids and texts are fetched by
  tasks for only the rows in an exact group or a near cluster (the rank's ties, the report), and
  rows of one hash group are compared by text, so the plan (dedup.plan_rows, as locally) is exact.
- Dedup's near-duplicate search, as a map-reduce over Ray tasks (ray_dedup.py chains them,
  minhash.py does the arithmetic, ray_tasks.py holds the task bodies and the chain's shapes):
  1. per block of the exact groups' representatives: their texts read and normalized by the task,
     shingles and signatures (`minhash._sketch_chunk`), band keys (`minhash._band_keys`),
     hash-partitioned by band key (the shuffle's map side); the sketch stays in the object store;
  2. per partition: equal (band, key) groups -> candidate pairs, re-partitioned by pair;
  3. per pair partition: the rows its candidates name, cut out of each block's sketch where the
     block lies (a second, small join), and the candidates verified with exact Jaccard
     (`minhash.ShingleSets`) from those rows only: no task receives a whole block's sketch;
  4. connected components: the verified pairs on the driver with `minhash.union_find` when there are
     at most `ray.driver_edges` of them, else min-label propagation over the edge shards where they
     lie (every round: each shard lowers its nodes' labels to their neighbours', the shards' labels
     are min-reduced and pointer-jumped, until nothing changes; edges never come to the driver);
  5. the kept row, the report and its similarities (tasks given the sketches of the reported
     pairs' rows only): dedup.py's order-free rule, as locally.
  Both give each text the smallest index of its component, so the plan is the local one exactly.
- The leakage check (split): the same shuffle over train + validation/test (the sketch tasks reading
  both sides' rows), keeping only the pairs across the two sides (a band-key join), verified; each
  query's best match chosen as locally; the ids of only the rows with a hit fetched by tasks.
- Reductions and filtered maps: a stage's counts, label sets and length histograms come from
  `reduce` (each task reads only the columns it needs of a block from the stage's files and returns
  a small partial: a Counter, a set, per-row fixed-width values; the driver combines them in row
  order), and clean's map, counts and filter are one pass of `map_filter` tasks that write only the
  kept rows (ray_io.py).
- Load (ray_load.py): the source read in parts (parts.py: byte ranges at line starts, row groups, a
  label folder's files) by tasks that run the local engine's reader and write the rows as Arrow
  files; ids numbered and checked across parts by a shuffle of fixed-width keys (min(parts, blocks)
  partitions); the driver adds up the parts' counts and facts by the rules of one whole read
  (sources.settle). The stage's rows are the last round's StageShards, renamed into the stage
  folder: each row written twice in all (round 1's file, the shard).

What still runs on the driver (the process that runs prepare), and what it holds:
- load: the parts' plan (cut points, row group numbers, a label folder's file list), their counts and
  first errors, the five ids a repeated-id error names; a `hub` dataset is read here whole
  (sources._read_hub), and a CSV holding a quote character is read by one task;
- clean, label, tokenize: none of their rows or columns. The driver receives per block the drop
  counts (clean), the class names found with their counts and first 3 ids each (label), a
  histogram of token lengths (tokenize, tallied in the map tasks, which drop its `truncated` column);
  it keeps memory-mapped views of the shards the tasks wrote. Two exceptions:
  label.unknown=drop with unknown labels filters them with datasets' filter on the driver (a pass
  over the mapped label column, 8 B of indices per kept row), and training a tokenizer reads the
  train texts here (the tokenizers trainer; a sample would not give the local tokenizer);
- split: the distinct source split names, then 1 B of split code per row (computed in the tasks
  from the id's hash or the source's split), or, stratified, 8 B of hash and 4 B of class per row
  (the ranking by hash within a class needs them all; the ids of rows whose hash ties only), and
  the row indices of each split (8 B per row); the leakage check: each query's best match and the
  ids of the rows with a hit;
- the stage folders are written by the tasks (above), so every node must see output_dir (shared
  storage on a cluster; a task that cannot see a stage's file fails naming it in one line);
- dedup: no text, id or source_split column; fixed-width numpy arrays per row (hash 16 B, length,
  exact group, kept row, the near labels), the verified pairs up to `ray.driver_edges` (16 B each),
  and the ids and texts of only the rows in a cluster (dicts); the plan of which row to keep and
  the report.
Measured (bench_ray.py --before, quiet machine, bench/RESULTS.md): the Ray dedup's driver peak RSS grows
340 B per short document (was 744 B; ~30% of that corpus's rows are in a cluster; the local engine ~2.1 KiB).

A task whose worker dies is rerun by Ray up to `ray.max_retries` times (a rerun map or save task
writes its shard again from the start); past that the stage fails with `StageFailed` (one line)
and, since its folder is only renamed into place when complete, nothing of it is taken as done
(nor when prepare dies between two of `save`'s renames: the shards lie in that temporary folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline.config import RayConfig
from pipeline.data.engines import StageFailed
from pipeline.data import ray_dedup, ray_io

REPO_ROOT = Path(__file__).resolve().parents[2]  # what workers put on sys.path: this checkout's `pipeline`
SCRATCH = ".ray-maps"  # inside a running stage's temporary folder: the shards its maps wrote


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("prepare.engine=ray needs Ray Data: pip install -c constraints.txt "
                         "'finetune-pipeline[ray]' (or set prepare.engine=local)") from None
    return ray


def _probe(host: str, port: int, timeout: float) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def _bootstrap(address: str) -> str:
    """host:port that `address` (auto, host:port, ray://host:port) points at; '' when auto finds none."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        current = Path("/tmp/ray/ray_current_cluster")  # where `ray start` records the local head
        if not address and current.is_file():
            address = current.read_text(encoding="utf-8").strip()
    return address.removeprefix("ray://")


def check_address(address: str, timeout: float) -> None:
    """Fail in `timeout` seconds, in one line, when nothing answers at a Ray address (ray.init would
    otherwise retry for minutes)."""
    target = _bootstrap(address)
    if not target:
        raise ValueError("ray.address=auto: no running Ray cluster found (no RAY_ADDRESS, no `ray start` on this "
                         "machine); start one with `ray start --head`, or set ray.address= (empty) to start a local Ray")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray.address={address!r} is not auto, host:port or ray://host:port")
    if not _probe(host, int(port), timeout):
        raise ValueError(f"ray.address={address}: nothing answers at {host}:{port} within {timeout:g} s "
                         f"(ray.connect_timeout_s); start the cluster or fix the address, or set ray.address= "
                         f"(empty) to start a local Ray")


def start_local(cfg: RayConfig) -> None:
    """Start a Ray on this machine whose workers import this checkout's `pipeline`."""
    ray = _import_ray()
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)  # inherited by workers
    try:
        ray.init(num_cpus=cfg.num_cpus or None, include_dashboard=False, log_to_driver=False,
                 object_store_memory=cfg.object_store_mb * 2**20 if cfg.object_store_mb else None,
                 logging_level="ERROR", configure_logging=True)
    finally:
        os.environ["PYTHONPATH"] = path
        if not path:
            del os.environ["PYTHONPATH"]


class RayEngine:
    name = "ray"

    def __init__(self, cfg: RayConfig, started: bool):
        self.cfg, self.started = cfg, started
        self.scratch, self._maps = None, 0  # where maps write their shards (see `stage`), and how many so far
        self.owned: set[str] = set()  # the StageShards this stage's tasks wrote: `save` may rename them
        self.cpus = max(1, int(_import_ray().cluster_resources().get("CPU", 1)))

    @classmethod
    def connect(cls, cfg: RayConfig) -> RayEngine:
        """Use the Ray this process is already attached to, join `ray.address`, or start a local one."""
        ray = _import_ray()
        if ray.is_initialized():
            return cls(cfg, started=False)
        if not cfg.address:
            start_local(cfg)
            return cls(cfg, started=True)
        check_address(cfg.address, cfg.connect_timeout_s)
        try:  # the cluster's nodes need this code at the same path (as training's machines do)
            ray.init(address=cfg.address, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
        except (ConnectionError, RuntimeError, TimeoutError) as e:
            raise ValueError(f"ray.address={cfg.address}: cannot join the cluster: {' '.join(str(e).split())}") from None
        return cls(cfg, started=True)

    def close(self) -> None:
        if self.started:
            _import_ray().shutdown()

    # ------------------------------------------------------------ common
    def blocks(self, rows: int) -> int:
        """How many Arrow blocks (and shuffle partitions) `rows` rows are cut into."""
        return max(1, min(rows, self.cfg.blocks or 4 * self.cpus))

    def task_options(self) -> dict:
        opts = {"num_cpus": self.cfg.cpus_per_task, "max_retries": self.cfg.max_retries}
        return {**opts, "memory": self.cfg.memory_per_task_mb * 2**20} if self.cfg.memory_per_task_mb else opts

    def get(self, refs: Any, what: str) -> Any:
        """ray.get, with a lost worker as one line and a stage's own error as itself."""
        ray = _import_ray()
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            if isinstance(getattr(e, "cause", None), Exception) and not isinstance(e.cause, ray.exceptions.RayError):
                raise e.cause from None
            raise self._failed(what, e) from None
        except ray.exceptions.RayError as e:
            raise self._failed(what, e) from None

    def _failed(self, what: str, e: Exception) -> StageFailed:
        first = re.sub(r"\x1b\[[0-9;]*m", "", (str(e).strip().splitlines() or [""])[0])[:200]  # no colour codes
        return StageFailed(f"{what} on Ray failed: a worker was lost and ray.max_retries={self.cfg.max_retries} "
                           f"reruns did not finish it ({type(e).__name__}: {first}); nothing of this stage was "
                           f"saved: run prepare again (the stages before it are reused)")

    # ------------------------------------------------------------ row-wise stages and stage folders
    @contextlib.contextmanager
    def stage(self, tmp: Path) -> Iterator[None]:
        """While a stage runs in its temporary folder `tmp`: the maps' shards go under it (so every
        node writes where the stage's folder is), and are removed before the folder is renamed."""
        self.scratch, self.owned = tmp / SCRATCH, set()
        try:
            yield
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch, self.owned = None, set()

    def map_folder(self) -> Path:
        """A new folder for one map's shards: under the running stage's folder, else a temporary one."""
        self.scratch = self.scratch or Path(tempfile.mkdtemp(prefix="ray-map-"))  # a stage called outside the runner
        self._maps += 1
        (folder := self.scratch / f"map-{self._maps:04d}").mkdir(parents=True)
        return folder

    def map_batches(self, ds: Any, fn: Any, added: dict, *, remove_columns: Any = None, batch_size: int = 1000,
                    min_rows_per_proc: int = 0, desc: str = "map", **_: Any) -> Any:
        """What `common.map_batches(ds, fn, added, ...)` returns, with `fn` run by Ray tasks that each read
        a block of `ds`'s rows from its files and write their mapped rows as one Arrow shard; the result
        is those shards, memory-mapped, in order (the driver holds none of the rows)."""
        from pipeline.data.common import map_batches

        if not ds.num_rows:
            return map_batches(ds, fn, added, remove_columns=remove_columns)
        return self._map_shards(ds, fn, added, remove_columns, batch_size, desc)[0]

    def _map_shards(self, ds: Any, fn: Any, added: dict, remove_columns: Any, batch_size: int, desc: str,
                    **filtered: Any) -> tuple[Any, list]:
        """(the shards, memory-mapped, in order; each task's tally) of ray_io.map_shard over `ds`'s
        blocks; `filtered`: map_filter's keep, drop, tally and combine."""
        import datasets

        removed = list(remove_columns or [])
        features = datasets.Features({**{k: v for k, v in ds.features.items() if k not in removed}, **added})
        folder, bounds = self.map_folder(), self.block_bounds(ds.num_rows)
        paths = [str(folder / f"shard-{k:05d}.arrow") for k in range(len(bounds))]
        task = _import_ray().remote(ray_io.map_shard).options(**self.task_options())
        source = ray_io.pack(ds)  # file names, column operations and row indices, not the rows
        done = self.get([task.remote(source, s, e, fn, removed, features, p, batch_size, **filtered)
                          for (s, e), p in zip(bounds, paths)], desc)
        self.owned.update(paths)  # StageShards: what save_to_disk writes for their rows
        return datasets.concatenate_datasets([datasets.Dataset.from_file(p) for p in paths]), [t for _, t in done]

    def save(self, data: Any, folder: Path) -> None:
        """`data` (a Dataset or DatasetDict) written to `folder` as save_to_disk lays it out: a split
        that is exactly one map's shards by renaming them (ray_io.renamable; a crash between renames
        leaves them in the stage's temporary folder, never renamed into place), any other each shard
        by a Ray task from the rows' own files; the metadata by the driver once every shard is in place."""
        import datasets

        ray = _import_ray()
        splits = [("", data)] if isinstance(data, datasets.Dataset) else list(data.items())
        if not isinstance(data, datasets.Dataset):
            ray_io.write_splits(folder, [name for name, _ in splits])
        task = ray.remote(ray_io.save_shard).options(**self.task_options())
        jobs, written, moves = [], [], []
        for name, ds in splits:
            where = folder / name if name else folder
            where.mkdir(parents=True, exist_ok=True)
            if (found := ray_io.renamable(ds, self.owned, where)) is not None:  # each row written once
                self.owned.difference_update(p for p, _ in found)  # a split naming them again is rewritten
                moves.append((found, where))
                written.append((ds, where, len(found)))
                continue
            n, size = ray_io.num_shards(ds, self.blocks(ds.num_rows)), ray_io.writer_batch_size(ds)
            packed = ray_io.pack(ds)
            jobs += [task.remote(packed, n, k, str(p), size) for k, p in enumerate(ray_io.shard_paths(where, n))]
            written.append((ds, where, n))
        self.get(jobs, "saving the stage")
        for found, where in moves:  # after the writes: another split's rows may be read from these files
            ray_io.rename_shards(found, where)
        for ds, where, n in written:
            ray_io.write_metadata(ds, where, n)

    # ------------------------------------------------------------ load: the sources read by tasks
    def load_source(self, path: Path, cfg: Any, where: str, read_whole: Any = None) -> tuple:
        """`read_whole`'s answer (sources.read_source: Dataset, drops by reason, rows read), the source
        read in parts by Ray tasks with the same readers and rules, which write its rows as shards
        (ray_load.py); the driver holds none of them."""
        from pipeline.data import ray_load

        return ray_load.load(self, path, cfg, where)

    # ------------------------------------------------------------ reductions and filtered maps (issue 15)
    def block_bounds(self, rows: int) -> list[tuple[int, int]]:
        """(start, end) of each block of contiguous rows, as map_batches cuts them: where datasets'
        `shard(n, k, contiguous=True)` cuts, so a map's shards are save_to_disk's (ray_io.StageShard)."""
        n = self.blocks(rows)
        div, mod = divmod(rows, n)  # datasets' contiguous shard(n, k): the first `mod` blocks one row longer
        starts = [div * k + min(k, mod) for k in range(n + 1)]
        return list(zip(starts[:-1], starts[1:]))

    def reduce(self, ds: Any, fn: Any, combine: Any, columns: list[str], *, batch_size: int = 10_000,
               desc: str = "reduce") -> Any:
        """What `LocalEngine.reduce` returns, from Ray tasks that each read `columns` of a block of
        `ds`'s rows from its files and return combine([fn(batch), ...]); the driver receives only
        those partials, one per block, and combines them in row order."""
        from pipeline.data.common import LocalEngine

        if not ds.num_rows:
            return LocalEngine.reduce(self, ds, fn, combine, columns)
        task = _import_ray().remote(ray_io.reduce_shard).options(**self.task_options())
        source = ray_io.pack(ds)
        return combine(self.get([task.remote(source, s, e, fn, combine, columns, batch_size)
                                  for s, e in self.block_bounds(ds.num_rows)], desc))

    def map_filter(self, ds: Any, fn: Any, added: dict, keep: Any, *, drop: list[str], tally: Any, combine: Any,
                   remove_columns: Any = None, batch_size: int = 1000, desc: str = "map", **_: Any) -> tuple[Any, Any]:
        """What `LocalEngine.map_filter` returns, in one pass of Ray tasks: each maps a block of rows
        read from `ds`'s files, tallies the mapped batches, writes only the kept rows (less `drop`) as
        one Arrow shard and returns its tally; the driver holds none of the rows."""

        from pipeline.data.common import LocalEngine

        if not ds.num_rows:
            return LocalEngine.map_filter(self, ds, fn, added, keep, drop=drop, tally=tally, combine=combine,
                                          remove_columns=remove_columns)
        kept, tallies = self._map_shards(ds, fn, added, remove_columns, batch_size, desc, keep=keep, drop=list(drop),
                                         tally=tally, combine=combine)
        return kept, combine(tallies)

    # ------------------------------------------------------------ dedup and the leakage check (ray_dedup.py)
    def cross_duplicates(self, reference: Any, query: Any, cfg: Any, threshold: float, find: Any = None) -> list:
        """minhash.cross_duplicates's answer for the two datasets' texts, by a band-key join on Ray
        (ray_dedup.cross_duplicates; `find`, the stage's in-process search, is the local engine's)."""
        return ray_dedup.cross_duplicates(self, reference, query, cfg, threshold)

    def plan_dedup(self, ds: Any, cfg: Any, protected: Any, plan_lists: Any = None) -> tuple[Any, Any]:
        """dedup's plan of `ds` from tasks' fixed-width facts, and the ids and texts (of only the rows
        in a cluster) its report reads: ray_dedup.plan (`plan_lists`, the in-process plan, is the local engine's)."""
        return ray_dedup.plan(self, ds, cfg, protected)
