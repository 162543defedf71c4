"""The Ray engine's disk side: tasks that read their rows from the stage folders themselves and
write Arrow shards, and the metadata that makes a folder of shards what `datasets.load_from_disk`
reads (engine_ray.py submits the tasks; the driver never holds the rows).

A stage's rows move as `datasets.Dataset` objects whose tables are memory-mapped Arrow files (the
previous stage's folder, or the shards a map wrote): pickled, such a Dataset is its file names,
the column operations to replay and, after a `select`, its row indices (8 B per row), so a task
given one reads its own slice from disk. On a cluster those files must be on storage every node
sees; a task that cannot see one fails with a one-line error saying so (`check_visible`).

Shard layout (datasets' own, as `Dataset.save_to_disk(num_shards=N)` writes it, with N = the
engine's blocks): data-0000k-of-0000N.arrow, one per task, then state.json and dataset_info.json,
written by the driver last; a DatasetDict adds dataset_dict.json and one such folder per split.
The stage's folder is renamed into place by the runner only after all of it is written.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from pipeline.data.engines.ray.tasks import apply_batch


def check_visible(path: str | os.PathLike) -> None:
    """One line when a stage's file or folder is missing on the node this task runs on."""
    if not os.path.exists(path):
        raise ValueError(f"{path}: not found on Ray node {socket.gethostname()}: with prepare.engine=ray every node "
                         f"reads and writes the stage folders itself, so output_dir (and TMPDIR of the process "
                         f"that runs prepare) must be on storage every node sees (a shared filesystem)")


def check_cache_visible(path: str | os.PathLike) -> None:
    """One line when a hub dataset's cache file (load_dataset wrote it on the driver's node) is missing
    on the node this task runs on."""
    if not os.path.exists(path):
        raise ValueError(f"{path}: not found on Ray node {socket.gethostname()}: with prepare.engine=ray the "
                         f"tasks read a hub dataset's rows from the Arrow files load_dataset wrote on the "
                         f"driver's node, so the Hugging Face datasets cache (HF_DATASETS_CACHE) must be on "
                         f"storage every node sees (a shared filesystem)")


def pack(ds: Any) -> tuple[list[str], Any]:
    """`ds` as a task receives it: the files it reads (checked on the node before anything opens
    them) and a reference to it in the object store (file names, column operations, row indices;
    an in-memory table's buffers, which a task on the same node maps without a copy)."""
    import ray

    return [f["filename"] for f in ds.cache_files], ray.put(ds)


def _unpack(packed: tuple[list[str], Any], out_path: str) -> Any:
    import ray

    files, ref = packed
    for f in [*files, os.path.dirname(out_path)]:
        check_visible(f)
    return ray.get(ref)


def map_shard(packed: tuple, start: int, end: int, fn: Any, removed: list, features: Any, path: str,
              batch_size: int, keep: Any = None, drop: list = (), tally: Any = None,
              combine: Any = None) -> tuple[int, Any]:
    """Rows start:end of the packed Dataset, read here from its files, mapped by `fn` batch by batch
    as `datasets.map(batched=True)` maps them (`features`: the mapped rows'), written as one Arrow shard
    at `path`: (its row count, combine of tally(table) over the mapped batches, or None). With `keep`
    (map_filter): only the rows where keep(table) holds are written; always less the columns `drop`."""
    from datasets import Features

    ds = _unpack(packed, path)
    schema, partials = features.arrow_schema, []
    with StageShard(Features({k: v for k, v in features.items() if k not in drop}), path) as writer:
        for table in ds.select(range(start, end)).with_format("arrow").iter(batch_size):
            out = apply_batch(table, fn, removed, schema)
            if tally is not None:
                partials.append(tally(out))
            writer.write((out.filter(keep(out)) if keep is not None else out).drop_columns(list(drop)))
        rows = writer.finish()
    return rows, combine(partials) if combine is not None else None


def save_shard(packed: tuple, num_shards: int, index: int, path: str, writer_batch_size: int) -> tuple[int, int]:
    """Shard `index` of `num_shards` (contiguous) of the packed Dataset, written by datasets' own
    shard writer, so its bytes are those `save_to_disk` writes; (rows, bytes)."""
    from datasets import Dataset

    ds = _unpack(packed, path)
    shard = ds.shard(num_shards=num_shards, index=index, contiguous=True)
    for _, done, content in Dataset._save_to_disk_single(index, shard, path, None, writer_batch_size):
        if done:
            return content
    raise RuntimeError(f"{path}: datasets' shard writer finished without a result")


def shard_paths(folder: Path, num_shards: int) -> list[Path]:
    return [folder / f"data-{k:05d}-of-{num_shards:05d}.arrow" for k in range(num_shards)]


def writer_batch_size(ds: Any) -> int:
    """The record batch size save_to_disk picks for `ds` (smaller for large rows)."""
    from datasets import config
    from datasets.arrow_writer import get_writer_batch_size_from_data_size

    nbytes = ds._estimate_nbytes()
    size = config.DEFAULT_MAX_BATCH_SIZE
    return min(size, get_writer_batch_size_from_data_size(len(ds), nbytes)) if nbytes > 0 else size


def num_shards(ds: Any, blocks: int) -> int:
    """One shard per block, and at least as many as save_to_disk writes (none above its 500 MB)."""
    from datasets import config
    from datasets.utils.py_utils import convert_file_size_to_int

    if not len(ds):
        return 1  # datasets writes none for zero rows, and load_from_disk then fails on the folder
    return max(blocks, int(ds._estimate_nbytes() / convert_file_size_to_int(config.MAX_SHARD_SIZE)) + 1)


def write_metadata(ds: Any, folder: Path, num_shards: int) -> None:
    """state.json and dataset_info.json of a folder of `num_shards` shards of `ds`, as save_to_disk
    writes them (the same keys, sorting and indentation)."""
    from datasets import config
    from datasets.utils.py_utils import asdict  # datasets' own: features as their JSON form

    keys = ("_fingerprint", "_format_columns", "_format_kwargs", "_format_type", "_output_all_columns")
    state = {key: ds.__dict__[key] for key in keys}
    state["_split"] = str(ds.split) if ds.split is not None else ds.split
    state["_data_files"] = [{"filename": p.name} for p in shard_paths(folder, num_shards)]
    with open(folder / config.DATASET_STATE_JSON_FILENAME, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    info = asdict(ds._info)
    with open(folder / config.DATASET_INFO_FILENAME, "w", encoding="utf-8") as f:
        json.dump({key: info[key] for key in sorted(info)}, f, indent=2)  # first level sorted, as datasets does


def write_splits(folder: Path, splits: list[str]) -> None:
    """dataset_dict.json of a DatasetDict folder, as DatasetDict.save_to_disk writes it."""
    from datasets import config

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / config.DATASETDICT_JSON_FILENAME, "w", encoding="utf-8") as f:
        json.dump({"splits": splits}, f)


# ---------------------------------------------------------------- reductions and filtered maps
def open_packed(packed: tuple[list[str], Any]) -> Any:
    """The packed Dataset, its files checked visible on this node first (a task that writes nothing)."""
    import ray

    for f in packed[0]:
        check_visible(f)
    return ray.get(packed[1])


def reduce_shard(packed: tuple, start: int, end: int, fn: Any, combine: Any, columns: list, batch_size: int) -> Any:
    """combine of fn(batch) over rows start:end of the packed Dataset, read here from its files, only
    `columns`, batch by batch as pyarrow Tables: a small partial (a Counter, a histogram, per-row
    fixed-width values), not the rows."""
    rows = open_packed(packed).select(range(start, end)).select_columns(columns).with_format("arrow")
    return combine([fn(table) for table in rows.iter(batch_size)] or [fn(rows[:])])


# ---------------------------------------------------------------- shards renamed into the stage folder (each row written once)
WRITE_BATCH = 1000  # datasets.config.DEFAULT_MAX_BATCH_SIZE: the record batch save_to_disk writes, unless the
# rows average over MAX_ROW_GROUP_SIZE / 1000 = 100 kB (then `writer_batch_size` is smaller and `save` rewrites)


class StageShard:
    """An Arrow shard written as `Dataset._save_to_disk_single` writes one, however its rows arrive:
    datasets' ArrowWriter with the same settings (the features' schema and metadata, embed_local_files),
    fed record batches of exactly WRITE_BATCH rows (the last one shorter), each written alone as
    save_to_disk writes each `iter(writer_batch_size)` table. So a map's shard is, byte for byte, the
    file save_to_disk writes for the same rows, and the stage folder can take it by a rename."""

    def __init__(self, features: Any, path: str):
        from datasets.arrow_writer import ArrowWriter

        self.writer = ArrowWriter(features=features, path=path, embed_local_files=True)
        self.pending: list = []  # tables not yet written: fewer than WRITE_BATCH rows in all

    def __enter__(self) -> StageShard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.writer.close()

    def write(self, table: Any) -> None:
        import pyarrow as pa

        self.pending.append(table)
        rows = sum(t.num_rows for t in self.pending)
        if rows < WRITE_BATCH:
            return
        whole, cut = pa.concat_tables(self.pending), rows - rows % WRITE_BATCH
        for start in range(0, cut, WRITE_BATCH):
            self.writer.write_table(whole.slice(start, WRITE_BATCH))
        self.pending = [whole.slice(cut)] if cut < rows else []

    def finish(self) -> int:
        """Write what is pending, close the file; the rows written."""
        import pyarrow as pa

        if self.pending and (rest := pa.concat_tables(self.pending)).num_rows:
            self.writer.write_table(rest)
        return self.writer.finalize()[0]


def renamable(ds: Any, owned: set[str], folder: Path) -> list[tuple[str, int]] | None:
    """[(file, rows)] of the shards `ds` is exactly the concatenation of, when each is a StageShard
    this stage's tasks wrote (`owned`) on `folder`'s filesystem whose header is the one save_to_disk
    writes for `ds`, and `ds` reads them as they lie (no row indices, no column operations: datasets'
    own schema-metadata replay only), at save_to_disk's record batch size and within its 500 MB per
    shard: renaming them into `folder` saves `ds`. Else None."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    t = ds.data
    blocks = [[t]] if isinstance(t, MemoryMappedTable) else getattr(t, "blocks", None) if isinstance(
        t, ConcatenationTable) else None
    if ds._indices is not None or not blocks or any(len(row) != 1 for row in blocks):
        return None
    tables = [row[0] for row in blocks]
    if not all(isinstance(b, MemoryMappedTable) and b.path in owned and
               all(op[0] == "replace_schema_metadata" for op in b.replays) for b in tables):
        return None
    found = [(b.path, b.num_rows) for b in tables if b.num_rows]
    if len({p for p, _ in found}) < len(found) or writer_batch_size(ds) != WRITE_BATCH:
        return None
    header, device = _save_header(ds), os.stat(folder).st_dev
    if len(found) < num_shards(ds, 1) or not all(os.stat(p).st_dev == device and
                                                 _header(p).equals(header, check_metadata=True) for p, _ in found):
        return None
    return found


def _header(path: str) -> Any:
    import pyarrow as pa

    with pa.memory_map(path) as f:
        return pa.ipc.open_stream(f).schema


def _save_header(ds: Any) -> Any:
    """The schema, with datasets' metadata, that save_to_disk's ArrowWriter writes for `ds`."""
    from datasets import DatasetInfo
    from datasets.arrow_writer import ArrowWriter

    return ds.features.arrow_schema.with_metadata(ArrowWriter._build_metadata(DatasetInfo(features=ds.features)))


def rename_shards(found: list[tuple[str, int]], folder: Path) -> int:
    """The shards moved into `folder` under save_to_disk's names, in order; how many (the folder's
    metadata is written after, by the driver, as for shards written in place)."""
    for (path, _), target in zip(found, shard_paths(folder, len(found))):
        os.rename(path, target)
    return len(found)


# ---------------------------------------------------------------- rows routed to outputs (split, dropped rows)
def route_shard(packed: tuple, start: int, end: int, rule: Any, drop: list, features: Any, paths: list,
                batch_size: int, *extra: Any, then: Any = None) -> list[int]:
    """Rows start:end of the packed Dataset, read here from its files batch by batch; rule(table, rows,
    *extra) gives each row's code k (rows: their indices in the Dataset; -1: written nowhere) and the
    row, less the columns `drop` (and through then(table) -> table, a row-wise transform, when given),
    is written to the shard at paths[k]. Returns the rows of each shard."""
    import contextlib

    import numpy as np
    import pyarrow as pa

    ds = open_packed(packed)
    for folder in {os.path.dirname(p) for p in paths}:
        check_visible(folder)
    with contextlib.ExitStack() as stack:  # what save_to_disk writes for their rows: renamable
        writers = [stack.enter_context(StageShard(features, p)) for p in paths]
        first = start
        for table in ds.select(range(start, end)).with_format("arrow").iter(batch_size):
            codes = rule(table, np.arange(first, first + table.num_rows), *extra)
            first += table.num_rows
            out = table.drop_columns(list(drop))
            out = then(out) if then is not None else out
            for k, writer in enumerate(writers):
                writer.write(out.filter(pa.array(codes == k)))
        return [writer.finish() for writer in writers]


def route(engine: Any, ds: Any, rule: Any, drop: list, outputs: int, desc: str, extra: list | None = None,
          then: Any = None, features: Any = None) -> list:
    """Per code k < outputs, the rows of `ds` (less `drop`) that rule(table, rows, *extra[b]) gives k, in
    order: one route_shard task per block b (extra[b]: its own arguments, object refs resolved by Ray),
    each writing one shard per code; the shards, memory-mapped. `then`: a row-wise transform of the rows
    before they are written, whose output has `features` (in the same pass: no second write)."""
    import datasets
    import ray

    features = features or datasets.Features({k: v for k, v in ds.features.items() if k not in drop})
    folder, bounds = engine.map_folder(), engine.block_bounds(ds.num_rows)
    paths = [[str(folder / f"shard-{b:05d}-{k}.arrow") for k in range(outputs)] for b in range(len(bounds))]
    task = ray.remote(route_shard).options(**engine.task_options())
    source = pack(ds)  # file names, column operations and row indices, not the rows
    extra = extra or [[]] * len(bounds)
    engine.get([task.remote(source, s, e, rule, list(drop), features, p, 1000, *x, then=then)
                for (s, e), p, x in zip(bounds, paths, extra)], desc)
    engine.owned.update(p for block in paths for p in block)  # StageShards: `save` may rename them
    return [datasets.concatenate_datasets([datasets.Dataset.from_file(p[k]) for p in paths]) for k in range(outputs)]


def _unlisted(table: Any, rows: Any, *listed: Any) -> Any:
    """0 for a row in none of the `listed` arrays of row indices, -1 (dropped) for one in any."""
    import numpy as np

    gone = np.concatenate(listed) if listed else np.zeros(0, dtype=np.int64)
    return np.where(np.isin(rows, gone), -1, 0).astype(np.int8)


def drop_rows(engine: Any, ds: Any, removed: list, desc: str) -> Any:
    """`ds` less the rows `removed` names (removed[b]: block b's arrays of row indices, or refs to them),
    written by a route pass: the others, in order."""
    return route(engine, ds, _unlisted, [], 1, desc, removed)[0]
