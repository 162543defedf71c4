"""The Ray engine (prepare.engine=ray): the stages' own functions, run in plain Ray tasks over blocks of
contiguous rows, each task reading its rows from the stage's files and writing its shard of the next.

The design, with diagrams (what each task reads and writes, dedup's chain over global row numbers,
split's routing, load's parts, what the driver holds, what is guaranteed and measured), is
docs/ray-engine.md. The modules: io.py (row-wise maps, reductions, StageShard, routing), load.py
(the source in parts), dedup.py (dedup on Ray), shuffle.py (the band-key and hash shuffles dedup and the
leakage check share), split.py (split's routing), tasks.py (task bodies and shapes). Every entry point
gives the local engine's answer (engines/local.py), tested row for row and byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from pipeline import REPO_ROOT
from pipeline.data.engines.base import StageFailed
from pipeline.data.engines.ray import io as ray_io
from pipeline.data.engines.ray import shuffle
from pipeline.schema import RayConfig

SCRATCH = ".ray-maps"  # inside a running stage's temporary folder: the shards its maps wrote


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("prepare.engine=ray needs Ray Data: pip install -c constraints.txt "
                         "'finetune-pipeline[ray]' (or set prepare.engine=local)") from None
    return ray


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _probe(host: str, port: int, timeout: float) -> str:
    """"none" (nothing answers), "grpc" (a gRPC server: Ray's GCS and its client server are) or "other".

    A gRPC server answers the HTTP/2 connection preface with a SETTINGS frame (its 4th byte is the
    frame type, 4); an HTTP/1 server, a database or anything else does not, and ray.init would retry
    it for minutes. Every wait is bounded by `timeout`."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return "none"
    head, deadline = b"", time.monotonic() + timeout
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE)
            while len(head) < 9 and time.monotonic() < deadline:
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except OSError:  # a timeout or a reset: not a gRPC server
            pass
    return "grpc" if len(head) == 9 and head[3] == 4 else "other"


# a method only Ray serves, asked with an empty request: the GCS's (host:port), the Ray Client server's (ray://)
RAY_METHODS = {False: "/ray.rpc.NodeInfoGcsService/GetClusterId", True: "/ray.rpc.RayletDriver/ClusterInfo"}


def _ray_rpc(host: str, port: int, method: str, timeout: float) -> str:
    """"ray" (the method is served), "other" (a gRPC server without it: UNIMPLEMENTED, or UNAVAILABLE: one that
    breaks the protocol) or "silent" (no answer within `timeout`: a listener that speaks HTTP/2's preface and nothing more,
    which ray.init would wait on for minutes)."""
    import grpc

    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        channel.unary_unary(method)(b"", timeout=timeout)
        return "ray"
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "silent"
        # any other status came from a handler of the method: Ray's, which the empty request may not please
        return "other" if code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE) else "ray"
    finally:
        channel.close()


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
    answer = _probe(host, int(port), timeout)
    if answer == "none":
        raise ValueError(f"ray.address={address}: nothing answers at {host}:{port} within {timeout:g} s "
                         f"(ray.connect_timeout_s); start the cluster or fix the address, or set ray.address= "
                         f"(empty) to start a local Ray")
    fix = "point ray.address at the head's GCS port (6379 by default) or its ray:// client port (10001)"
    if answer != "grpc":
        raise ValueError(f"ray.address={address}: {host}:{port} answers but is not a Ray cluster (no gRPC reply "
                         f"within {timeout:g} s, ray.connect_timeout_s); {fix}")
    method = RAY_METHODS[address.startswith("ray://")]
    served = _ray_rpc(host, int(port), method, timeout)
    if served == "silent":
        raise ValueError(f"ray.address={address}: {host}:{port} speaks HTTP/2 but did not answer Ray's {method} within "
                         f"{timeout:g} s (ray.connect_timeout_s); {fix}")
    if served != "ray":
        raise ValueError(f"ray.address={address}: {host}:{port} is a gRPC server but not Ray's (it does not serve "
                         f"{method}); {fix}")


def start_local(cfg: RayConfig) -> None:
    """Start a Ray on this machine whose workers import this checkout's `pipeline`."""
    ray = _import_ray()
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)  # inherited by workers
    try:
        ray.init(num_cpus=cfg.num_cpus or None, include_dashboard=False, log_to_driver=False,
                 object_store_memory=cfg.object_store_mb * 2**20 if cfg.object_store_mb else None,
                 logging_level="ERROR", configure_logging=True)
    except Exception as e:  # ray.init raises a bare Exception when a process it started died or timed out
        raise StageFailed(f"a local Ray did not start ({_first_line(e)}); Ray's logs: /tmp/ray/session_latest/logs") from None
    finally:
        os.environ["PYTHONPATH"] = path
        if not path:
            del os.environ["PYTHONPATH"]
    one_line_system_messages(ray)


def _first_line(e: BaseException) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", (str(e).strip().splitlines() or [""])[0])[:200]  # no colour codes


def one_line_system_messages(ray) -> None:
    """Ray's system messages to the driver (a raylet died, a worker was killed for memory) as one
    `warning: ray: ...` line each on stderr, not their multi-line dumps on stdout (the whole text is
    in Ray's session logs). Ray prints them from a thread through `ray._private.worker.print_to_stdstream`."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    if worker is None or not hasattr(worker, "print_to_stdstream"):  # another Ray: its own printing stays
        return

    said: set[str] = set()  # Ray repeats a message (a raylet's death comes once per subscriber)

    def one_line(data: dict, ignore_prefix: bool = False) -> None:
        first = " ".join(next((ln for ln in data.get("lines", []) if ln.strip()), "").split())
        short = ""
        for sentence in re.split(r"(?<=\.)\s+", first):  # whole sentences, about a line's worth
            short = f"{short} {sentence}".strip()
            if len(short) >= 40:
                break
        line = f"warning: ray ({data.get('pid', 'system')}): {short[:300]}"
        if short and line not in said:
            said.add(line)
            print(line, file=sys.stderr, flush=True)

    worker.print_to_stdstream = one_line


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
        one_line_system_messages(ray)
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
        x = _import_ray().exceptions
        if isinstance(e, (x.LocalRayletDiedError, x.NodeDiedError, x.RaySystemError)):  # retries cannot help
            why = "Ray itself failed: a raylet or node it ran on died"
        else:
            why = f"a worker was lost and ray.max_retries={self.cfg.max_retries} reruns did not finish it"
        return StageFailed(f"{what} on Ray failed: {why} ({type(e).__name__}: {_first_line(e)}); nothing of this "
                           f"stage was saved: run prepare again (the stages before it are reused)")

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
        """What `ops.map_batches(ds, fn, added, ...)` returns, with `fn` run by Ray tasks that each read
        a block of `ds`'s rows from its files and write their mapped rows as one Arrow shard; the result
        is those shards, memory-mapped, in order (the driver holds none of the rows)."""
        from pipeline.data.engines.ops import map_batches

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
        """`read_whole`'s answer (load.read_source: Dataset, drops by reason, rows read), the source
        read in parts by Ray tasks with the same readers and rules, which write its rows as shards
        (ray_load.py); the driver holds none of them."""
        from pipeline.data.engines.ray import load as ray_load

        return ray_load.load(self, path, cfg, where)

    # ------------------------------------------------------------ reductions and filtered maps
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
        from pipeline.data.engines.local import LocalEngine

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

        from pipeline.data.engines.local import LocalEngine

        if not ds.num_rows:
            return LocalEngine.map_filter(self, ds, fn, added, keep, drop=drop, tally=tally, combine=combine,
                                          remove_columns=remove_columns)
        kept, tallies = self._map_shards(ds, fn, added, remove_columns, batch_size, desc, keep=keep, drop=list(drop),
                                         tally=tally, combine=combine)
        return kept, combine(tallies)

    # ------------------------------------------------------------ dedup and the leakage check (shuffle.py)
    def cross_duplicates(self, reference: Any, query: Any, cfg: Any, threshold: float, find: Any = None) -> list:
        """minhash.cross_duplicates's answer for the two datasets' texts, by a band-key join on Ray
        (shuffle.cross_duplicates; `find`, the stage's in-process search, is the local engine's)."""
        return shuffle.cross_duplicates(self, reference, query, cfg, threshold)

    def dedup(self, ds: Any, cfg: Any, splits: Any, report: Path, local: Any = None) -> tuple:
        """The dedup stage's work on `ds` (kept rows, drops, stats, test split counts; the report written to
        `report`), as `local` (dedup.dedup_lists, the local engine's) gives it, by a chain of Ray tasks
        that leaves no per-row state on the driver (ray_dedup.py)."""
        from pipeline.data.engines.ray import dedup as ray_dedup

        if not ds.num_rows:
            return local(ds, cfg, splits, report, 1)
        return ray_dedup.dedup(self, ds, cfg, splits, report)

    # ------------------------------------------------------------ split's rows, routed by tasks (ray_split.py)
    def split_rows(self, ds: Any, cfg: Any, split_local: Any = None, stratum: Any = None) -> tuple[dict, bool]:
        """split.split_rows's answer from tasks that write each split's rows (`split_local` is the local way)."""
        from pipeline.data.engines.ray import split as ray_split

        return ray_split.split_rows(self, ds, cfg, stratum)

    def drop_rows(self, ds: Any, rows: list[int]) -> Any:
        """`ds` without `rows` (ascending), written by tasks that copy the other rows (no indices here)."""
        from pipeline.data.engines.ray import split as ray_split

        return ray_split.drop_rows(self, ds, rows)
