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

import functools
import hashlib
from typing import Any

import numpy as np

from pipeline.data import minhash, ray_io
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

    packed, task = ray_io.pack(ds), ray.remote(_row_facts).options(**engine.task_options())
    facts = engine.get([task.remote(packed, s, e) for s, e in engine.block_bounds(ds.num_rows)],
                        "dedup (text hashes)")
    strings = RayStrings(engine, ds)
    first = verified_first(first_of_hashes(np.concatenate([h for h, _ in facts])), strings)
    length = np.concatenate([n for _, n in facts])
    del facts
    return plan_rows(first, length, cfg, lambda reps: near_rows(engine, packed, reps, cfg), strings, protected), strings


def joined(reference: Any, query: Any):
    """segments(s, e) of rows s:e of the reference's rows followed by the query's (the leakage join)."""
    nr, pr, pq = reference.num_rows, ray_io.pack(reference), ray_io.pack(query)

    def segments(s: int, e: int) -> list:
        ref = [(pr, range(s, min(e, nr)))] if s < nr else []
        return ref + ([(pq, range(max(s, nr) - nr, e - nr))] if e > nr else [])

    return segments


# ---------------------------------------------------------------- the shuffle: signatures to verified pairs


def _verified_pairs(engine: Any, n: int, segments: Any, cfg: Any, threshold: float, normalized: bool,
                    split_at: int = 0):
    """Verified similar pairs among n texts through the shuffle (ray_tasks' docstring): (edge refs,
    candidates, verified, block starts, sketch refs, bands, rows). segments(s, e): where the sketch
    task of texts s:e reads them ((packed Dataset, rows) pairs: ray_dedup.py). split_at > 0: only
    pairs i < split_at <= j (a join)."""
    import ray

    b, r = minhash.lsh_params(threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    nb = engine.blocks(n)
    parts = nb  # shuffle partitions
    starts = np.linspace(0, n, nb + 1).astype(np.int64)
    sketch = ray.remote(_sketch_rows).options(num_returns=1 + parts, **engine.task_options())
    mapped = [sketch.remote(segments(int(s), int(e)), normalized, int(s), cfg, b, r, parts)
              for s, e in zip(starts[:-1], starts[1:])]
    sketches = [m[0] for m in mapped]
    group = ray.remote(tasks._band_pairs).options(num_returns=parts, **engine.task_options())
    grouped = [tasks.as_list(group.remote(n, parts, split_at, *[m[1 + p] for m in mapped])) for p in range(parts)]
    plan = ray.remote(tasks._pairs_and_rows).options(num_returns=1 + nb, **engine.task_options())
    planned = [plan.remote(n, starts, *[g[q] for g in grouped]) for q in range(parts)]
    subs = _gather(engine, sketches, starts, [p[1:] for p in planned])
    verify = ray.remote(tasks._verify).options(num_returns=3, **engine.task_options())
    checked = [verify.remote(cfg, threshold, planned[q][0], *subs[q]) for q in range(parts)]
    counts = np.array(engine.get([c[2] for c in checked], "MinHash (signatures, LSH, verification)"))
    candidates, verified, fetched = (int(x) for x in counts.sum(axis=0))
    _count_traffic(engine, sketches, n * b * 24, fetched, parts)
    return [c[:2] for c in checked], candidates, verified, starts, sketches, b, r

def _gather(engine: Any, sketches: list, starts: np.ndarray, wanted: list) -> list[list]:
    """Per consumer c, the refs of the sub-sketches (one per block, in block order) of the rows
    wanted[c][k] (global, ascending; arrays or refs) of each block k: made where the block lies."""
    import ray

    take = ray.remote(tasks._take_rows).options(num_returns=len(wanted), **engine.task_options())
    per_block = [tasks.as_list(take.remote(sk, int(starts[k]), *[w[k] for w in wanted]))
                 for k, sk in enumerate(sketches)]
    return [[per_block[k][c] for k in range(len(sketches))] for c in range(len(wanted))]

def _count_traffic(engine: Any, sketches: list, band_key_bytes: int, fetched: int, parts: int) -> None:
    """What the last shuffle moved between tasks, in bytes (bench_ray.py reports it): the band-key
    triples (band, key, row: 24 B each), the sub-sketches the verification tasks received, and the
    blocks' whole sketches (what `parts` verification tasks would receive if each took them all)."""
    import ray

    size = ray.remote(tasks.sketch_bytes).options(**engine.task_options())
    whole = sum(engine.get([size.remote(sk) for sk in sketches], "MinHash (sketch sizes)"))
    engine.traffic = {"band_key_bytes": band_key_bytes, "verify_sketch_bytes": fetched,
                    "all_blocks_sketch_bytes": whole, "parts": parts}

def near_rows(engine: Any, packed: tuple, reps: np.ndarray, cfg: Any) -> tuple[np.ndarray, Any, dict]:
    """dedup._near_clusters's three answers (labels, Jaccard of pairs, stats) for rows `reps` of the
    packed Dataset, from tasks on Ray that read and normalize those rows' texts themselves."""
    from pipeline.data.dedup import near_stats

    checked, candidates, verified, starts, sketches, b, r = _verified_pairs(engine, 
        len(reps), lambda s, e: [(packed, reps[s:e])], cfg, cfg.threshold, True)
    edge_refs = [c[0] for c in checked]
    if verified <= engine.cfg.driver_edges:
        edges = np.concatenate(engine.get(edge_refs, "dedup (collecting pairs)"))
        labels = minhash.union_find(len(reps), edges.astype(np.int64).reshape(-1, 2))
    else:
        labels = _components(engine, len(reps), edge_refs)
    stats = near_stats(candidates, verified, cfg, b, r, len(sketches))
    return labels, functools.partial(_jaccard, engine, starts, sketches), stats

def cross_duplicates(engine: Any, reference: Any, query: Any, cfg: Any, threshold: float) -> list:
    """minhash.cross_duplicates's answer for the two datasets' texts (each query row's most similar
    reference row at Jaccard >= threshold, ties to the smallest reference row): a band-key join of
    the two sides, verified, the sketch tasks reading the texts themselves."""
    if not reference.num_rows or not query.num_rows:
        return []
    nr = reference.num_rows
    checked, *_ = _verified_pairs(engine, nr + query.num_rows, joined(reference, query), cfg, threshold,
                                       False, split_at=nr)
    found = engine.get([x for c in checked for x in c], "the leakage check")
    pairs, sim = np.concatenate(found[0::2]).reshape(-1, 2), np.concatenate(found[1::2])
    order = np.lexsort((pairs[:, 0], -sim, pairs[:, 1]))  # by query, highest Jaccard, smallest reference
    pairs, sim = pairs[order], sim[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = pairs[1:, 1] != pairs[:-1, 1]
    return [(q - nr, i, s) for (i, q), s in zip(pairs[first].tolist(), sim[first].tolist())]

def _components(engine: Any, n: int, edge_refs: list) -> np.ndarray:
    """(n,) the smallest index of each node's component, the edges staying in their shards."""
    import ray

    lower = ray.remote(tasks._lower_labels).options(**engine.task_options())
    merge = ray.remote(tasks._merge_labels).options(num_returns=2, **engine.task_options())
    labels = ray.put(np.arange(n, dtype=np.int64))
    while True:
        proposals = [lower.remote(labels, e) for e in edge_refs]
        labels, changed = merge.remote(labels, *proposals)
        if not engine.get(changed, "dedup (connected components)"):
            return engine.get(labels, "dedup (connected components)")

def _jaccard(engine: Any, starts: np.ndarray, sketches: list, pairs: np.ndarray) -> np.ndarray:
    """(K,) exact Jaccard of pairs (K, 2) of texts, from the sketches of only their rows."""
    import ray

    if not len(pairs):
        return np.zeros(0)
    chunks = np.array_split(pairs, min(len(pairs), len(sketches)))
    subs = _gather(engine, sketches, starts, [tasks.rows_by_block(c, starts) for c in chunks])
    task = ray.remote(tasks._pair_jaccard).options(**engine.task_options())
    refs = [task.remote(c, *sub) for c, sub in zip(chunks, subs)]
    return np.concatenate(engine.get(refs, "dedup (report similarities)"))
