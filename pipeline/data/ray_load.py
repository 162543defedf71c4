"""The load stage on Ray (engine_ray.RayEngine.load_source): the source read in parts by tasks, the
rows never on the driver, the answer the local engine's (sources.read_source) row for row.

The parts are parts.plan_parts's (byte ranges at line starts, row groups, label folders' files).
Four rounds of tasks; the driver receives counts and the few facts that make the parts add up:
  1. read, per part: parts.read_part (the format's reader, the same as the local engine's) writes the
     part's rows to an Arrow file and returns its Facts (rows, bad lines, first error, columns seen).
     A CSV's ranges are first moved to record starts (round 1a: per range, its quote bytes counted;
     parts.record_parts); a hub dataset's parts are row ranges of its splits' cache files (load_dataset
     ran on the driver; a split that is not memory-mapped is read on the driver, as locally).
     JSONL parts that did not all take pyarrow's path with the same inferred kinds are read again
     with the line reader (as one read of the whole file would have been); a CSV part whose quotes
     the parity rule does not model sends the file back to be read as one part. sources.settle then
     raises the error one read would raise first and says how many rows of each part max_rows keeps.
  2. finish, per part: sources.finish_rows (the first rows max_rows keeps, strings, empty texts,
     split names), then a fixed-width key per row: the content hash (the content id's 16 hex digits,
     as 8 bytes) or a 128-bit BLAKE2b of the id column's value, with the row's (part, row), hash-
     partitioned (the shuffle's map side); the driver gets (rows, empty texts, empty ids) per part.
  3. copies, per key partition: equal keys in (part, row) order: a content id's copies numbered
     2, 3, ... (`sources.copy_id`), sent to their parts; repeated ids counted, with the first five by
     first occurrence (the driver reads those five ids from round 2's files for the one-line error).
  4. write, per part: ids numbered, the sample (sources.finish_table), one Arrow shard.
The stage's rows are those shards, memory-mapped, in order; the runner's `save` then writes the stage
folder from them, shard by shard, by tasks. Everything lies in the stage's temporary folder, so a
failed load leaves nothing that a later run takes for complete.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data import parts, ray_io, sources
from pipeline.data.ray_tasks import _partition_of, as_list

ROW_BITS = 40  # a row's key carries (part << 40 | row): 2^40 rows per part, 2^23 parts


def load(engine: Any, path: Path, cfg: Any, where: str) -> tuple:
    """(the rows as a Dataset of the shards the tasks wrote, drops by reason, rows read)."""
    import datasets
    import ray

    folder = engine.map_folder()
    pieces = parts.plan_parts(path, cfg, part_count(engine))
    pieces, facts = _read(engine, ray, path, cfg, pieces, folder)
    limits, bad, rows_read = sources.settle(facts, cfg, where)
    n = len(pieces)
    by_id = bool(cfg.id_field) or cfg.format == "folder"
    finish = ray.remote(_finish_part).options(num_returns=1 + n, **engine.task_options())
    finished = [as_list(finish.remote(str(folder / f"raw-{k:05d}.arrow"), cfg, where, limits[k], k, n, by_id,
                                       str(folder / f"rows-{k:05d}.arrow"))) for k in range(n)]
    counts = engine.get([f[0] for f in finished], "load (the rows' rules)")
    _remove(folder, "raw")  # read by round 2: the disk holds each row at most twice from here on
    if blank := sum(c[2] for c in counts):
        raise sources.blank_ids_error(blank, cfg, where)
    copies = ray.remote(_copies).options(num_returns=1 + n, **engine.task_options())
    grouped = [as_list(copies.remote(n, by_id, *[f[1 + p] for f in finished])) for p in range(n)]
    if by_id:
        _check_repeats(engine, [g[0] for g in grouped], folder, cfg, where)
    write = ray.remote(_write_part).options(**engine.task_options())
    paths = [str(folder / f"part-{k:05d}.arrow") for k in range(n)]
    written = engine.get([write.remote(str(folder / f"rows-{k:05d}.arrow"), cfg, paths[k],
                                        *[g[1 + k] for g in grouped]) for k in range(n)], "load (writing the rows)")
    _remove(folder, "rows")
    data = datasets.concatenate_datasets([datasets.Dataset.from_file(p) for p in paths])
    dropped = {"bad_line": bad, "empty": sum(c[1] for c in counts), "not_sampled": sum(written)}
    return data, dropped, rows_read


def part_count(engine: Any) -> int:
    """The engine's blocks (ray.blocks, else 4 per CPU): parts.plan_parts adds more for a large file."""
    return engine.cfg.blocks or 4 * engine.cpus


def _read(engine: Any, ray: Any, path: Path, cfg: Any, pieces: list, folder: Path) -> tuple[list, list]:
    """Round 1 (the module docstring): every part read, read again where one read of the file would differ."""
    read = ray.remote(_read_part).options(**engine.task_options())

    def run(todo: dict) -> dict:
        refs = {k: read.remote(path, cfg, pieces[k], lines, str(folder / f"raw-{k:05d}.arrow"))
                for k, lines in todo.items()}
        return dict(zip(refs, engine.get(list(refs.values()), "load (reading the source)")))

    if cfg.format == "hub" and pieces == [parts.WHOLE]:  # a split not memory-mapped: read here, as locally
        table, facts = parts.read_part(path, cfg, parts.WHOLE)
        if table is not None:
            _write_arrow(table, str(folder / "raw-00000.arrow"))
        return pieces, [facts]
    pieces = _record_parts(engine, ray, path, cfg, pieces)
    facts = run({k: False for k in range(len(pieces))})
    if any(f.quoted for f in facts.values()):  # a CSV quote the parity rule does not model: one part
        pieces = [parts.WHOLE]
        facts = run({0: False})
    found = [facts[k] for k in range(len(pieces))]
    if cfg.format == "jsonl" and not parts.agree(found) and not any(f.error and f.error[0] == 0 for f in found):
        again = run({k: True for k, f in enumerate(found) if not f.lines})
        for k, f in again.items():  # what pyarrow's parse found still decides the first columns check
            f.parsed, f.kinds = found[k].parsed, found[k].kinds
            found[k] = f
    return pieces, found


def _record_parts(engine: Any, ray: Any, path: Path, cfg: Any, pieces: list) -> list:
    """Round 1a, a CSV's line-start ranges moved to record starts by their quote counts (parts.py)."""
    if cfg.format != "csv" or len(pieces) < 2 or not parts.parity_applies(cfg):
        return pieces
    count = ray.remote(parts.quote_facts).options(**engine.task_options())
    counted = engine.get([count.remote(path, p.span) for p in pieces], "load (finding the CSV's record starts)")
    return parts.record_parts(pieces, counted, path.stat().st_size)


# ---------------------------------------------------------------- the task bodies (run on Ray workers)


def _read_part(path: Path, cfg: Any, part: parts.Part, lines: bool, out: str) -> parts.Facts:
    for file in part.rows[1] if part.rows else ():  # a hub split's cache files, written on the driver's node
        ray_io.check_cache_visible(file)
    table, facts = parts.read_part(path, cfg, part, lines)
    if table is not None:
        _write_arrow(table, out)
    return facts


def _finish_part(raw: str, cfg: Any, where: str, limit: int, k: int, n: int, by_id: bool, out: str) -> Any:
    """[(rows, empty texts, empty ids), then per key partition an (M, 3) uint64 array (key, key, code)]."""
    import pyarrow as pa

    cols, empty = sources.finish_rows(_read_arrow(raw), cfg, where, limit)
    if by_id:
        ids = cols["id"].to_pylist()
        blank = sources.blank_ids(cols["id"])
        digests = b"".join(hashlib.blake2b(i.encode("utf-8"), digest_size=16).digest() for i in ids)
        keys = np.frombuffer(digests, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    else:
        hexes = sources.content_hashes(cols["text"].to_pylist())
        cols["id"], blank = pa.array(hexes, pa.string()), 0
        keys = np.zeros((len(hexes), 2), dtype=np.uint64)
        keys[:, 0] = np.frombuffer(bytes.fromhex("".join(hexes)), dtype=">u8")
    _write_arrow(pa.table(cols), out)
    rows = len(keys)
    code = (np.uint64(k) << np.uint64(ROW_BITS)) | np.arange(rows, dtype=np.uint64)
    triples = np.concatenate([keys, code[:, None]], axis=1)
    where_to = _partition_of(triples[:, 0] ^ triples[:, 1], n)
    return [(rows, empty, blank), *[triples[where_to == p] for p in range(n)]]


def _copies(n: int, by_id: bool, *triples: np.ndarray) -> Any:
    """One key partition: [summary, then per part an (M, 2) int64 array (row, copy number > 1)].
    summary: by_id, (ids that repeat, [(first code, rows)] of the first five by first occurrence)."""
    t = np.concatenate(triples) if triples else np.zeros((0, 3), dtype=np.uint64)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]  # by key, then (part, row): the source's order
    head = np.ones(len(t), dtype=bool)
    head[1:] = (t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1])
    starts = np.flatnonzero(head)
    sizes = np.diff(np.append(starts, len(t)))
    empty = [np.zeros((0, 2), dtype=np.int64)] * n
    if by_id:
        repeated = sizes > 1
        first = sorted(zip(t[starts[repeated], 2].tolist(), sizes[repeated].tolist()))[:5]
        return [(int(repeated.sum()), first), *empty]
    copy = np.arange(len(t)) - np.repeat(starts, sizes) + 1  # 1 for a text's first row in the source
    later, codes = copy > 1, t[:, 2]
    part, row = (codes >> np.uint64(ROW_BITS)).astype(np.int64), (codes & np.uint64(2**ROW_BITS - 1)).astype(np.int64)
    return [(0, []), *[np.stack([row[later & (part == k)], copy[later & (part == k)]], axis=1) for k in range(n)]]


def _write_part(rows_file: str, cfg: Any, out: str, *copies: np.ndarray) -> int:
    """The part's rows with their ids numbered and the sample applied, as one Arrow shard; rows left out."""
    import pyarrow as pa
    from datasets import Features, Value
    from datasets.arrow_writer import ArrowWriter

    table = _read_arrow(rows_file)
    cols = {name: table.column(name) for name in table.column_names}
    numbered = np.concatenate(copies) if copies else np.zeros((0, 2), dtype=np.int64)
    if len(numbered):
        ids = cols["id"].to_pylist()
        for row, copy in numbered.tolist():
            ids[row] = sources.copy_id(ids[row], copy)
        cols["id"] = pa.array(ids, pa.string())
    table, unsampled = sources.finish_table(cols, cfg)
    writer = ArrowWriter(features=Features({name: Value("string") for name in sources.COLUMNS}), path=out)
    try:
        writer.write_table(table)
        writer.finalize()
    finally:
        writer.close()
    return unsampled


# ---------------------------------------------------------------- helpers


def _check_repeats(engine: Any, summaries: list, folder: Path, cfg: Any, where: str) -> None:
    """The local engine's one line for repeated ids, from the partitions' counts and first five."""
    found = engine.get(summaries, "load (checking ids)")
    repeats = sum(s[0] for s in found)
    if not repeats:
        return
    first = sorted(x for s in found for x in s[1])[:5]
    shown = []
    for code, rows in first:  # five ids read back from round 2's files (memory-mapped)
        k, row = code >> ROW_BITS, code & (2**ROW_BITS - 1)
        shown.append((_read_arrow(str(folder / f"rows-{k:05d}.arrow")).column("id")[row].as_py(), rows))
    raise sources.repeated_ids_error(repeats, shown, cfg, where)


def _remove(folder: Path, kind: str) -> None:
    for path in folder.glob(f"{kind}-*.arrow"):
        path.unlink()


def _write_arrow(table: Any, path: str) -> None:
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _read_arrow(path: str) -> Any:
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(path)).read_all()
