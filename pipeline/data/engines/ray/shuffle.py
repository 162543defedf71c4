"""The MinHash shuffle on Ray: verified similar pairs, their connected components, and the leakage check's
band-key join (ray_dedup.py runs dedup's stage on them; engine_ray.py calls cross_duplicates).

Tasks read their rows from the stage's own Arrow files (a packed Dataset: ray_io.pack), the sketch tasks
read and normalize the texts they sign themselves, and node ids are global rows: dedup's sketch task of
block k signs that block's rows less the exact copies of smaller rows (given as ObjectRefs, resolved by
Ray), so a component's smallest node is a row, as in the local engine's order. No text, id or
per-row array reaches the driver: it holds refs, counts, and the verified pairs when at most
ray.driver_edges of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.data.engines.ray import io as ray_io
from pipeline.data.engines.ray import tasks
from pipeline.data.similarity import minhash
from pipeline.data.similarity.shingling import normalize_text

# ---------------------------------------------------------------- task bodies (run on Ray workers)


def _sketch_rows(segments: list, normalized: bool, start: int, cfg: Any, bands: int, rows: int, parts: int,
                 *excluded: np.ndarray) -> list:
    """ray_tasks._sketch_block of the texts of `segments` ((packed Dataset, rows) pairs, in order: global
    rows start, start + 1, ...) less the global rows `excluded` (arrays), read here, normalized first
    when `normalized` (dedup; the leakage check signs raw texts)."""
    skip = np.concatenate(excluded) if excluded else np.zeros(0, dtype=np.int64)
    texts, at, offset = [], [], start
    for packed, local in segments:
        local = np.asarray(local, dtype=np.int64)
        keep = ~np.isin(offset + np.arange(len(local)), skip)
        texts += ray_io.open_packed(packed).select(local[keep])[TEXT][:] if keep.any() else []
        at.append(offset + np.flatnonzero(keep))
        offset += len(local)
    if normalized:
        texts = [normalize_text(t) for t in texts]
    return tasks._sketch_block(texts, np.concatenate(at), cfg, bands, rows, parts, normalized)


def _clustered_nodes(labels: np.ndarray, parts: int) -> Any:
    """The (node, label) pairs (K, 2) of the nodes in a component of two or more (min-label labels (n,)),
    partitioned by node into `parts`."""
    moved = np.flatnonzero(labels != np.arange(len(labels)))
    nodes = np.union1d(moved, labels[moved])
    return tasks._one_or_list(by_key(np.stack([nodes, labels[nodes]], axis=1), nodes, parts))


def by_key(values: np.ndarray, keys: np.ndarray, parts: int) -> list[np.ndarray]:
    """`values` (M, ...) split by a hash of `keys` (M,) into `parts`, each in its original order."""
    return split_by(values, tasks._partition_of(keys, parts), parts)


def split_by(values: np.ndarray, where: np.ndarray, parts: int) -> list[np.ndarray]:
    """`values` (M, ...) split by `where` (M,) in [0, parts), each part in its original order."""
    order = np.argsort(where, kind="stable")
    cuts = np.searchsorted(where[order], np.arange(parts + 1))
    return [values[order[a:b]] for a, b in zip(cuts[:-1], cuts[1:])]


# ---------------------------------------------------------------- the driver's side


def joined(reference: Any, query: Any):
    """segments(s, e) of rows s:e of the reference's rows followed by the query's (the leakage join)."""
    nr, pr, pq = reference.num_rows, ray_io.pack(reference), ray_io.pack(query)

    def segments(s: int, e: int) -> list:
        ref = [(pr, range(s, min(e, nr)))] if s < nr else []
        return ref + ([(pq, range(max(s, nr) - nr, e - nr))] if e > nr else [])

    return segments


# ---------------------------------------------------------------- the shuffle: signatures to verified pairs


def verified_pairs(engine: Any, n: int, segments: Any, cfg: Any, threshold: float, normalized: bool,
                   split_at: int = 0, excluded: list | None = None, sketched: int = -1):
    """Verified similar pairs among n texts through the shuffle (ray_tasks' docstring): (edge refs,
    candidates, verified, sketch refs, bands, rows). segments(s, e): where the sketch task of texts
    s:e (the engine's block bounds) reads them ((packed Dataset, rows) pairs). excluded[k]: refs of
    arrays of block k's global rows not to sketch (`sketched` rows are left; default all n). split_at
    > 0: only pairs i < split_at <= j (a join)."""
    import ray

    b, r = minhash.lsh_params(threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    bounds = engine.block_bounds(n)
    parts = nb = len(bounds)  # shuffle partitions
    starts = np.array([s for s, _ in bounds] + [n], dtype=np.int64)
    sketch = ray.remote(_sketch_rows).options(num_returns=2 + parts, **engine.task_options())
    mapped = [sketch.remote(segments(s, e), normalized, s, cfg, b, r, parts, *(excluded[k] if excluded else []))
              for k, (s, e) in enumerate(bounds)]
    group = ray.remote(tasks._band_pairs).options(num_returns=parts, **engine.task_options())
    grouped = [tasks.as_list(group.remote(n, parts, split_at, *[m[2 + p] for m in mapped])) for p in range(parts)]
    plan = ray.remote(tasks._pairs_and_rows).options(num_returns=1 + nb, **engine.task_options())
    planned = [plan.remote(n, starts, *[g[q] for g in grouped]) for q in range(parts)]
    subs = _gather(engine, mapped, [p[1:] for p in planned])
    verify = ray.remote(tasks._verify).options(num_returns=3, **engine.task_options())
    checked = [verify.remote(cfg, threshold, planned[q][0], *subs[q]) for q in range(parts)]
    counts = np.array(engine.get([c[2] for c in checked], "MinHash (signatures, LSH, verification)"))
    candidates, verified, fetched = (int(x) for x in counts.sum(axis=0))
    sketches = [m[0] for m in mapped]
    _count_traffic(engine, sketches, (n if sketched < 0 else sketched) * b * 24, fetched, parts)
    return [c[:2] for c in checked], candidates, verified, sketches, b, r

def _gather(engine: Any, mapped: list, wanted: list) -> list[list]:
    """Per consumer c, the refs of the sub-sketches (one per block, in block order) of the rows
    wanted[c][k] (global, ascending; arrays or refs) of each block k: made where the block's sketch
    and its rows (mapped[k][:2]) lie."""
    import ray

    take = ray.remote(tasks._take_rows).options(num_returns=len(wanted), **engine.task_options())
    per_block = [tasks.as_list(take.remote(m[0], m[1], *[w[k] for w in wanted])) for k, m in enumerate(mapped)]
    return [[per_block[k][c] for k in range(len(mapped))] for c in range(len(wanted))]

def _count_traffic(engine: Any, sketches: list, band_key_bytes: int, fetched: int, parts: int) -> None:
    """What the last shuffle moved between tasks, in bytes (bench_ray.py reports it): the band-key
    triples (band, key, row: 24 B each), the sub-sketches the verification tasks received, and the
    blocks' whole sketches (what `parts` verification tasks would receive if each took them all)."""
    import ray

    size = ray.remote(tasks.sketch_bytes).options(**engine.task_options())
    whole = sum(engine.get([size.remote(sk) for sk in sketches], "MinHash (sketch sizes)"))
    engine.traffic = {"band_key_bytes": band_key_bytes, "verify_sketch_bytes": fetched,
                    "all_blocks_sketch_bytes": whole, "parts": parts}

def near_components(engine: Any, n: int, checked: list, verified: int, parts: int) -> list:
    """Refs, one per partition of the nodes (by_key), of the (node, label) pairs (K, 2) of every node
    of n in a component of two or more, labelled by its smallest node (as minhash.union_find labels).
    At most ray.driver_edges verified pairs: union-find on the driver over the edges' endpoints only
    (compressed ids, not n). More: min-label propagation (_components) over the edge shards, where the
    (n,) labels live in the object store and one merge task per round, never on the driver."""
    import ray

    edge_refs = [c[0] for c in checked]
    if verified <= engine.cfg.driver_edges:
        edges = np.concatenate(engine.get(edge_refs, "dedup (collecting pairs)")).astype(np.int64).ravel()
        nodes, ends = np.unique(edges, return_inverse=True)
        labels = nodes[minhash.union_find(len(nodes), ends.reshape(-1, 2))]
        return [ray.put(p) for p in by_key(np.stack([nodes, labels], axis=1), nodes, parts)]
    split = ray.remote(_clustered_nodes).options(num_returns=parts, **engine.task_options())
    return tasks.as_list(split.remote(_components(engine, n, edge_refs), parts))

def cross_duplicates(engine: Any, reference: Any, query: Any, cfg: Any, threshold: float) -> list:
    """minhash.cross_duplicates's answer for the two datasets' texts (each query row's most similar
    reference row at Jaccard >= threshold, ties to the smallest reference row): a band-key join of
    the two sides, verified, the sketch tasks reading the texts themselves."""
    if not reference.num_rows or not query.num_rows:
        return []
    nr = reference.num_rows
    checked, *_ = verified_pairs(engine, nr + query.num_rows, joined(reference, query), cfg, threshold,
                                 False, split_at=nr)
    found = engine.get([x for c in checked for x in c], "the leakage check")
    pairs, sim = np.concatenate(found[0::2]).reshape(-1, 2), np.concatenate(found[1::2])
    order = np.lexsort((pairs[:, 0], -sim, pairs[:, 1]))  # by query, highest Jaccard, smallest reference
    pairs, sim = pairs[order], sim[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = pairs[1:, 1] != pairs[:-1, 1]
    return [(q - nr, i, s) for (i, q), s in zip(pairs[first].tolist(), sim[first].tolist())]

def _components(engine: Any, n: int, edge_refs: list) -> Any:
    """A ref of the (n,) smallest index of each node's component, the edges staying in their shards."""
    import ray

    lower = ray.remote(tasks._lower_labels).options(**engine.task_options())
    merge = ray.remote(tasks._merge_labels).options(num_returns=2, **engine.task_options())
    labels = ray.remote(tasks._first_labels).options(**engine.task_options()).remote(n)  # not on the driver
    while True:
        proposals = [lower.remote(labels, e) for e in edge_refs]
        labels, changed = merge.remote(labels, *proposals)
        if not engine.get(changed, "dedup (connected components)"):
            return labels
