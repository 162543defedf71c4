"""Dedup and the leakage check on Ray without the texts and ids on the driver (engine_ray.py calls these).

The driver holds fixed-width state per row only. Tasks read their rows from the stage's own Arrow files
(a packed Dataset: ray_io.pack) and return, per row, a 128-bit hash of the normalized text (exact groups)
and its length in characters (the rank); the source_split column comes back as its distinct values and
an int code per row. The sketch tasks read and normalize the texts they sign themselves (the exact
groups' representatives only, as the local engine signs). What needs strings is fetched by tasks for
only the rows that need it: the ranking's ties (id, then raw text) and the report's ids and snippets
for the rows of an exact group of two or more or of a near cluster; the leakage report's ids for the
rows with a hit. Rows with equal hashes have their normalized texts compared once fetched, so a hash
collision never merges two different texts: the plan is dedup.plan_rows's, the local engine's exactly.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from pipeline.data import ray_io
from pipeline.data import ray_tasks as tasks
from pipeline.data.dedup import Strings, _copied, plan_rows
from pipeline.data.shingling import normalize_text

# ---------------------------------------------------------------- task bodies (run on Ray workers)


def _open(packed: tuple) -> Any:
    """The packed Dataset, its files checked visible on this node first."""
    import ray

    files, ref = packed
    for f in files:
        ray_io.check_visible(f)
    return ray.get(ref)


def _row_facts(packed: tuple, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows start:end: (M, 2) uint64 blake2b-128 of each normalized text and (M,) int64 its characters."""
    norm = [normalize_text(t) for t in _open(packed).select(range(start, end))["text"][:]]
    digest = b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in norm)
    return np.frombuffer(digest, dtype=np.uint64).reshape(-1, 2), np.fromiter(map(len, norm), np.int64, len(norm))


def _column_codes(packed: tuple, start: int, end: int, name: str) -> tuple[list, np.ndarray]:
    """Rows start:end of column `name`: its distinct values (first appearance first) and (M,) codes."""
    seen: dict = {}
    codes = [seen.setdefault(v, len(seen)) for v in _open(packed).select(range(start, end))[name][:]]
    return list(seen), np.array(codes, dtype=np.int64)


def _rows_of(packed: tuple, rows: np.ndarray, names: tuple[str, ...]) -> list[list]:
    """Columns `names` at `rows` (ascending), one list each."""
    part = _open(packed).select(rows)
    return [part[n][:] for n in names]


def _sketch_rows(segments: list, normalized: bool, start: int, cfg: Any, bands: int, rows: int, parts: int) -> list:
    """ray_tasks._sketch_block of the texts of `segments` ((packed Dataset, rows) pairs, in order),
    read here, normalized first when `normalized` (dedup; the leakage check signs raw texts)."""
    texts = [t for packed, at in segments for t in _open(packed).select(at)["text"][:]]
    if normalized:
        texts = [normalize_text(t) for t in texts]
    return tasks._sketch_block(texts, start, cfg, bands, rows, parts, normalized)


# ---------------------------------------------------------------- the driver's side


def bounds(engine: Any, n: int) -> list[int]:
    """Block edges of n rows (engine.blocks of them, contiguous)."""
    return np.linspace(0, n, engine.blocks(n) + 1).astype(int).tolist()


def value_codes(engine: Any, ds: Any, name: str) -> tuple[list, np.ndarray]:
    """dedup.value_codes of column `name`, each block's by a task, merged in block order."""
    import ray

    packed, edges = ray_io.pack(ds), bounds(engine, ds.num_rows)
    task = ray.remote(_column_codes).options(**engine._options())
    found = engine._get([task.remote(packed, s, e, name) for s, e in zip(edges[:-1], edges[1:])], f"reading {name}")
    seen: dict = {}
    parts = [np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int64)[codes]
             for values, codes in found if len(codes)]
    return list(seen), np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class RayStrings(Strings):
    """Ids and raw texts of only the rows asked for (dicts by row), fetched by one task per block."""

    def __init__(self, engine: Any, packed: tuple, edges: list[int]):
        super().__init__({}, {})
        self.engine, self.packed, self.edges = engine, packed, np.array(edges)
        self.fetched = 0  # rows fetched so far (a test reads it)

    def need(self, rows: np.ndarray) -> None:
        import ray

        missing = np.array([r for r in rows.tolist() if r not in self.ids], dtype=np.int64)
        if not len(missing):
            return
        task = ray.remote(_rows_of).options(**self.engine._options())
        wanted = [w for w in tasks.rows_by_block(missing, self.edges) if len(w)]
        found = self.engine._get([task.remote(self.packed, w, ("id", "text")) for w in wanted], "dedup (ids and texts)")
        for w, (ids, texts) in zip(wanted, found):
            self.ids.update(zip(w.tolist(), ids))
            self.texts.update(zip(w.tolist(), texts))
        self.fetched += len(missing)


def first_of_hashes(h: np.ndarray) -> np.ndarray:
    """(N,) the smallest row with the same hash (N, 2) as each row."""
    order = np.lexsort((h[:, 1], h[:, 0]))  # stable: equal hashes in row order
    head = np.ones(len(h), dtype=bool)
    head[1:] = (h[order][1:] != h[order][:-1]).any(axis=1)
    first = np.empty(len(h), dtype=np.int64)
    first[order] = order[head][np.cumsum(head) - 1]
    return first


def verified_first(by_hash: np.ndarray, strings: Strings) -> np.ndarray:
    """dedup.first_of_texts's labels from the hash groups', their rows' normalized texts compared:
    rows of one hash group whose texts differ (a collision) get groups of their own."""
    copied = _copied(by_hash)
    strings.need(copied)
    first, seen = by_hash.copy(), {}
    for i in copied.tolist():  # ascending: each text's group keeps its smallest row
        first[i] = seen.setdefault((int(by_hash[i]), normalize_text(strings.texts[i])), i)
    return first


def plan(engine: Any, ds: Any, cfg: Any, protected: np.ndarray | None) -> tuple[Any, RayStrings]:
    """dedup.plan_rows of `ds` from the tasks' facts; the plan, and the strings its report reads."""
    import ray

    packed, edges = ray_io.pack(ds), bounds(engine, ds.num_rows)
    task = ray.remote(_row_facts).options(**engine._options())
    facts = engine._get([task.remote(packed, s, e) for s, e in zip(edges[:-1], edges[1:])], "dedup (text hashes)")
    strings = RayStrings(engine, packed, edges)
    first = verified_first(first_of_hashes(np.concatenate([h for h, _ in facts])), strings)
    length = np.concatenate([n for _, n in facts])
    del facts
    return plan_rows(first, length, cfg, lambda reps: engine.near_rows(packed, reps, cfg), strings, protected), strings


def joined(reference: Any, query: Any):
    """segments(s, e) of rows s:e of the reference's rows followed by the query's (the leakage join)."""
    nr, pr, pq = reference.num_rows, ray_io.pack(reference), ray_io.pack(query)

    def segments(s: int, e: int) -> list:
        ref = [(pr, range(s, min(e, nr)))] if s < nr else []
        return ref + ([(pq, range(max(s, nr) - nr, e - nr))] if e > nr else [])

    return segments


def fetch(engine: Any, ds: Any, rows: list[int], name: str) -> list:
    """Column `name` at `rows` (ascending), read by one task per block that holds some."""
    import ray

    if not rows:
        return []
    wanted = tasks.rows_by_block(np.asarray(rows, dtype=np.int64), np.array(bounds(engine, ds.num_rows)))
    task, packed = ray.remote(_rows_of).options(**engine._options()), ray_io.pack(ds)
    found = engine._get([task.remote(packed, w, (name,)) for w in wanted if len(w)], f"reading {name}")
    return [v for (values,) in found for v in values]
