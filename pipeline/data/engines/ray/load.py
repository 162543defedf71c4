"""The load stage on Ray (engine_ray.RayEngine.load_source): the source read in parts by tasks, the
rows never on the driver, the answer the local engine's (load_stage.read_source) row for row.

The parts are formats.plan_parts's (byte ranges at line starts, row groups, label folders' files).
Four rounds of tasks; the driver receives counts and the few facts that make the parts add up:
  1. read, per part: formats.read_part (the format's reader, the same as the local engine's) writes the
     part's rows to an Arrow file and returns its Facts (rows, bad lines, first error, columns seen).
     A CSV's ranges are first moved to record starts (round 1a: per range, its quote bytes counted;
     parts.record_parts); a hub dataset's parts are row ranges of its splits' cache files (load_dataset
     ran on the driver; a split that is not memory-mapped is read on the driver, as locally).
     JSONL parts that did not all take pyarrow's path with the same inferred kinds are read again
     with the line reader (as one read of the whole file would have been); a CSV part whose quotes
     the parity rule does not model sends the file back to be read as one part. load_stage.settle then
     raises the error one read would raise first and says how many rows of each part max_rows keeps.
  2. keys, per part: load_stage.finish_rows on round 1's file (the first rows max_rows keeps, strings,
     empty texts, split names), then a fixed-width key per row: the content hash (the content id's 16
     hex digits, as 8 bytes) or a 128-bit BLAKE2b of the id column's value, with the row's (part, row),
     hash-partitioned into `key_partitions` partitions (the engine's blocks of the rows, at most the
     parts: parts x partitions outputs, not parts x parts); the driver gets (rows, empty texts, empty
     ids) per part. Nothing is written: round 4 applies the same rules to the same file again.
  3. copies, per key partition: equal keys in (part, row) order: a content id's copies numbered
     2, 3, ... (`load_stage.copy_id`), sent to their parts; repeated ids counted, with the first five by
     first occurrence (tasks read those five ids from round 1's files for the one-line error).
  4. write, per part: round 2's rows again, ids numbered, the sample (load_stage.finish_table), written
     as the stage folder's shard (ray_io.StageShard).
The stage's rows are those shards, memory-mapped, in order; the runner's `save` renames them into the
stage folder. So each row is written twice in all, round 1's file and the final shard, and the disk
holds at most those two copies. Everything lies in the stage's temporary folder, so a failed load leaves
nothing that a later run takes for complete.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.data.engines.ray import io as ray_io
from pipeline.data.engines.ray.tasks import _partition_of, as_list
from pipeline.data.io import formats, parts
from pipeline.data.stages import load as load_stage

ROW_BITS = 40  # a row's key carries (part << 40 | row): 2^40 rows per part, 2^23 parts


def load(engine: Any, path: Path, cfg: Any, where: str) -> tuple:
    """(the rows as a Dataset of the shards the tasks wrote, drops by reason, rows read)."""
    import datasets
    import ray

    folder = engine.map_folder()
    pieces = formats.plan_parts(path, cfg, part_count(engine))
    pieces, facts = _read(engine, ray, path, cfg, pieces, folder)
    limits, bad, rows_read = load_stage.settle(facts, cfg, where)
    n, raws = len(pieces), [str(folder / f"raw-{k:05d}.arrow") for k in range(len(pieces))]
    by_id = bool(cfg.id_field) or cfg.format == "folder"
    keys = key_partitions(engine, n, sum(limits))
    finish = ray.remote(_finish_part).options(num_returns=1 + keys, **engine.task_options())
    finished = [as_list(finish.remote(raws[k], cfg, where, limits[k], k, keys, by_id)) for k in range(n)]
    counts = engine.get([f[0] for f in finished], "load (the rows' rules)")
    if blank := sum(c[2] for c in counts):
        raise load_stage.blank_ids_error(blank, cfg, where)
    copies = ray.remote(_copies).options(num_returns=1 + n, **engine.task_options())
    grouped = [as_list(copies.remote(n, by_id, *[f[1 + p] for f in finished])) for p in range(keys)]
    if by_id:
        _check_repeats(engine, [g[0] for g in grouped], raws, limits, cfg, where)
    write = ray.remote(_write_part).options(**engine.task_options())
    paths = [str(folder / f"part-{k:05d}.arrow") for k in range(n)]
    written = engine.get([write.remote(raws[k], cfg, where, limits[k], by_id, paths[k], *[g[1 + k] for g in grouped])
                          for k in range(n)], "load (writing the rows)")
    _remove(folder, "raw")
    engine.owned.update(paths)  # StageShards: the stage folder takes them by a rename (engine.save)
    data = datasets.concatenate_datasets([datasets.Dataset.from_file(p) for p in paths])
    dropped = {"bad_line": bad, "empty": sum(c[1] for c in counts), "not_sampled": sum(written)}
    return data, dropped, rows_read


def key_partitions(engine: Any, parts_: int, rows: int) -> int:
    """The id shuffle's partitions: as many as the engine's blocks of the rows, at most one per part,
    so its outputs number parts x partitions (a task's keys per partition), not parts x parts (a
    large file's plan_parts may cut 2,048 parts: 4 M object refs)."""
    return max(1, min(parts_, engine.blocks(rows)))


def part_count(engine: Any) -> int:
    """The engine's blocks (ray.blocks, else 4 per CPU): formats.plan_parts adds more for a large file."""
    return engine.cfg.blocks or 4 * engine.cpus


def _read(engine: Any, ray: Any, path: Path, cfg: Any, pieces: list, folder: Path) -> tuple[list, list]:
    """Round 1 (the module docstring): every part read, read again where one read of the file would differ."""
    read = ray.remote(_read_part).options(**engine.task_options())

    def run(todo: dict) -> dict:
        refs = {k: read.remote(path, cfg, pieces[k], lines, str(folder / f"raw-{k:05d}.arrow"))
                for k, lines in todo.items()}
        return dict(zip(refs, engine.get(list(refs.values()), "load (reading the source)")))

    if cfg.format == "hub" and pieces == [parts.WHOLE]:  # a split not memory-mapped: read here, as locally
        table, facts = formats.read_part(path, cfg, parts.WHOLE)
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
    table, facts = formats.read_part(path, cfg, part, lines)
    if table is not None:
        _write_arrow(table, out)
    return facts


def _rows_of(raw: str, cfg: Any, where: str, limit: int, by_id: bool) -> tuple[dict, int]:
    """A part's rows by the row-wise rules (load_stage.finish_rows), a content id (the text's hash, not yet
    numbered) as the id of a source without ids: (columns, empty texts). Rounds 2 and 4 both run it on
    round 1's file, so the rows are written once more only when final (round 4)."""
    import pyarrow as pa

    cols, empty = load_stage.finish_rows(_read_arrow(raw), cfg, where, limit)
    if not by_id:
        cols["id"] = pa.array(load_stage.content_hashes(cols[TEXT].to_pylist()), pa.string())
    return cols, empty


def _finish_part(raw: str, cfg: Any, where: str, limit: int, k: int, keys: int, by_id: bool) -> Any:
    """[(rows, empty texts, empty ids), then per key partition an (M, 3) uint64 array (key, key, code)]."""
    cols, empty = _rows_of(raw, cfg, where, limit, by_id)
    ids = cols["id"].to_pylist()
    if by_id:
        blank = load_stage.blank_ids(cols["id"])
        digests = b"".join(hashlib.blake2b(i.encode("utf-8"), digest_size=16).digest() for i in ids)
        key = np.frombuffer(digests, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    else:
        blank, key = 0, np.zeros((len(ids), 2), dtype=np.uint64)
        key[:, 0] = np.frombuffer(bytes.fromhex("".join(ids)), dtype=">u8")
    rows = len(key)
    code = (np.uint64(k) << np.uint64(ROW_BITS)) | np.arange(rows, dtype=np.uint64)
    triples = np.concatenate([key, code[:, None]], axis=1)
    where_to = _partition_of(triples[:, 0] ^ triples[:, 1], keys)
    return [(rows, empty, blank), *[triples[where_to == p] for p in range(keys)]]


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


def _write_part(raw: str, cfg: Any, where: str, limit: int, by_id: bool, out: str, *copies: np.ndarray) -> int:
    """The part's rows with their ids numbered and the sample applied, as the stage folder's shard
    (ray_io.StageShard: what save_to_disk writes for them); the rows left out."""
    import pyarrow as pa
    from datasets import Features, Value

    cols, _ = _rows_of(raw, cfg, where, limit, by_id)
    numbered = np.concatenate(copies) if copies else np.zeros((0, 2), dtype=np.int64)
    if len(numbered):
        ids = cols["id"].to_pylist()
        for row, copy in numbered.tolist():
            ids[row] = load_stage.copy_id(ids[row], copy)
        cols["id"] = pa.array(ids, pa.string())
    table, unsampled = load_stage.finish_table(cols, cfg)
    with ray_io.StageShard(Features({name: Value("string") for name in load_stage.COLUMNS}), out) as writer:
        writer.write(table)
        writer.finish()
    return unsampled


def _ids_at(raw: str, cfg: Any, where: str, limit: int, rows: list[int]) -> list[str]:
    """The ids of a few of a part's rows (a repeated-id error's), read here from round 1's file."""
    return _rows_of(raw, cfg, where, limit, True)[0]["id"].take(rows).to_pylist()


# ---------------------------------------------------------------- helpers


def _check_repeats(engine: Any, summaries: list, raws: list[str], limits: list[int], cfg: Any, where: str) -> None:
    """The local engine's one line for repeated ids, from the partitions' counts and first five."""
    import ray

    found = engine.get(summaries, "load (checking ids)")
    repeats = sum(s[0] for s in found)
    if not repeats:
        return
    first = sorted(x for s in found for x in s[1])[:5]
    at = [(code >> ROW_BITS, code & (2**ROW_BITS - 1)) for code, _ in first]
    task = ray.remote(_ids_at).options(**engine.task_options())
    wanted = {k: [row for j, row in at if j == k] for k, _ in at}  # five ids read by tasks from their parts
    ids = dict(zip(wanted, engine.get([task.remote(raws[k], cfg, where, limits[k], rows)
                                       for k, rows in wanted.items()], "load (checking ids)")))
    taken = {k: iter(v) for k, v in ids.items()}
    shown = [(next(taken[k]), rows) for (k, _), (_, rows) in zip(at, first)]
    raise load_stage.repeated_ids_error(repeats, shown, cfg, where)


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
