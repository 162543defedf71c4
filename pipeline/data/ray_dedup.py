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
from pipeline.data.common import fetch
from pipeline.data import ray_tasks as tasks
from pipeline.data.dedup import Strings, _copied, plan_rows
from pipeline.data.shingling import normalize_text

# ---------------------------------------------------------------- task bodies (run on Ray workers)


def _row_facts(packed: tuple, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows start:end: (M, 2) uint64 blake2b-128 of each normalized text and (M,) int64 its characters."""
    norm = [normalize_text(t) for t in ray_io.open_packed(packed).select(range(start, end))["text"][:]]
    digest = b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in norm)
    return np.frombuffer(digest, dtype=np.uint64).reshape(-1, 2), np.fromiter(map(len, norm), np.int64, len(norm))


def _sketch_rows(segments: list, normalized: bool, start: int, cfg: Any, bands: int, rows: int, parts: int) -> list:
    """ray_tasks._sketch_block of the texts of `segments` ((packed Dataset, rows) pairs, in order),
    read here, normalized first when `normalized` (dedup; the leakage check signs raw texts)."""
    texts = [t for packed, at in segments for t in ray_io.open_packed(packed).select(at)["text"][:]]
    if normalized:
        texts = [normalize_text(t) for t in texts]
    return tasks._sketch_block(texts, start, cfg, bands, rows, parts, normalized)


# ---------------------------------------------------------------- the driver's side


class RayStrings(Strings):
    """Ids and raw texts of only the rows asked for (dicts by row), read by tasks (common.fetch)."""

    def __init__(self, engine: Any, ds: Any):
        super().__init__({}, {})
        self.engine, self.ds = engine, ds
        self.fetched = 0  # rows fetched so far (a test reads it)

    def need(self, rows: np.ndarray) -> None:
        missing = [r for r in rows.tolist() if r not in self.ids]
        if not missing:
            return
        ids, texts = fetch(self.engine, self.ds, missing, ("id", "text"))
        self.ids.update(zip(missing, ids))
        self.texts.update(zip(missing, texts))
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

    packed, task = ray_io.pack(ds), ray.remote(_row_facts).options(**engine._options())
    facts = engine._get([task.remote(packed, s, e) for s, e in engine._block_bounds(ds.num_rows)], "dedup (text hashes)")
    strings = RayStrings(engine, ds)
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
