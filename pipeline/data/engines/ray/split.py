"""Split's rows on Ray without per-row arrays on the driver (engine_ray.RayEngine.split_rows, drop_rows).

The split of a row is split.py's rule, computed in tasks: the id's hash against the ratios, the
source's split name, or (stratified) the row's rank by (hash, id, row) within its class. One pass of
`ray_io.route_shard` tasks reads a block's rows, computes their codes and writes the rows of each split as
that split's shard, so a split's Dataset is its shards, memory-mapped, in block order: the rows
`select(flatnonzero(codes == k))` gives locally, in the same order, with no row index on the driver.

Stratified, the cut of class c falls at ranks n_train = round(n_c * cuts[0]) and n_val (split.py's
_stratified_codes); the row at such a rank is the cut's threshold (hash, id, row index), and a row
goes below the cut when its (hash, id, row index) is smaller. Found by a distributed selection:
  1. tasks count each class's rows per bucket of the hash's top bits (BUCKETS buckets), per block,
     and other tasks add the blocks' counts up (a tree): the driver receives one histogram
     (classes x BUCKETS int64, whatever the rows and blocks): n_c, and the bucket of each cut rank;
  2. tasks return the hash, id and row index of only the rows in those buckets (~2 n_c / BUCKETS
     rows per class); the driver sorts them by (hash, id, row), as _stratified_codes ranks a class
     (ties of hash by id, then by row: its sorts are stable, and a stage run on its own may see an
     id twice), and reads off the threshold.
The driver holds per class two thresholds and, for a moment, the histogram and those rows.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pipeline.data.engines.ray import io as ray_io
from pipeline.data.stages import split

BUCKETS = 2**16  # per class; fewer for many classes, so that classes x buckets stays <= MAX_COUNTERS
MAX_COUNTERS = 2**22  # 32 MiB of int64 counts on the driver, whatever the number of classes
FAN_IN = 16  # block histograms one task adds up


def buckets_for(classes: int) -> int:
    """Buckets per class: BUCKETS, halved until classes x buckets <= MAX_COUNTERS (at least 1)."""
    b = BUCKETS
    while b > 1 and classes * b > MAX_COUNTERS:
        b //= 2
    return b


def _bucket(u: np.ndarray, buckets: int) -> np.ndarray:
    """(rows,) int64 bucket of each hash in [0, 1] (u * buckets is exact for a power of 2; u = 1.0 can occur)."""
    return np.minimum((u * buckets).astype(np.int64), buckets - 1)


# ---------------------------------------------------------------- task bodies (run on Ray workers)
def _by_table(table: Any, rows: np.ndarray, codes_of: Any) -> np.ndarray:
    """A rule that needs only the batch (split.py's per-batch code functions)."""
    return codes_of(table)


def _bucket_counts(table: Any, keys: Any, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct class * buckets + bucket codes, their row counts) of a batch: a sparse histogram."""
    u, cls = keys(table)
    return np.unique(cls.astype(np.int64) * buckets + _bucket(u, buckets), return_counts=True)


def _dense_counts(partials: list, size: int) -> np.ndarray:
    """A block's sparse histograms (one per batch) as one dense (size,) int64 array."""
    codes, counts = (np.concatenate([p[k] for p in partials]) for k in (0, 1))
    return np.bincount(codes, weights=counts, minlength=size).astype(np.int64)


def _sum(*arrays: np.ndarray) -> np.ndarray:
    return np.sum(arrays, axis=0)


def candidates_shard(packed: tuple, start: int, end: int, keys: Any, buckets: int,
                     wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
    """(codes, hashes, ids, row indices) of the rows start:end of the packed Dataset whose class * buckets
    + bucket is in `wanted` (the cuts' buckets), read here batch by batch."""
    rows = ray_io.open_packed(packed).select(range(start, end)).select_columns(["id", "label"])
    parts, first = [], start
    for table in rows.with_format("arrow").iter(10_000):
        u, cls = keys(table)
        code = cls.astype(np.int64) * buckets + _bucket(u, buckets)
        hit = np.flatnonzero(np.isin(code, wanted))
        ids = table.column("id").to_pylist() if len(hit) else []
        parts.append((code[hit], u[hit], [ids[k] for k in hit.tolist()], first + hit))
        first += table.num_rows
    return (*(np.concatenate([p[k] for p in parts]) for k in (0, 1)), [i for p in parts for i in p[2]],
            np.concatenate([p[3] for p in parts]))


def _cut_codes(table: Any, rows: np.ndarray, keys: Any, hashes: np.ndarray, ties: list) -> np.ndarray:
    """(rows,) int8 codes of a batch by the thresholds: hashes (classes, 2) float64 (inf: no cut, all
    below), ties[c][j] the (id, row index) of cut j's threshold row; a row is below a cut when its
    (hash, id, row) is smaller; below cut 0 is train, below cut 1 validation, else test."""
    u, cls = keys(table)
    codes = np.full(len(u), 2, dtype=np.int8)
    batch_ids = None
    for j in (1, 0):
        t = hashes[cls, j]
        below = u < t
        tied = np.flatnonzero(u == t)  # the threshold row itself, and rows whose hash equals its
        if len(tied):
            batch_ids = batch_ids or table.column("id").to_pylist()
            below[tied] = [(batch_ids[k], int(rows[k])) < ties[cls[k]][j] for k in tied.tolist()]
        codes[below] = j
    return codes


# ---------------------------------------------------------------- the driver's side
def _histogram(engine: Any, ds: Any, keys: Any, classes: int, buckets: int) -> np.ndarray:
    """(classes, buckets) int64 rows per class and hash bucket: a dense histogram per block (from the
    batches' sparse ones), summed by tasks in a tree (FAN_IN at a time), so the driver receives one."""
    import ray

    size, opts = classes * buckets, engine.task_options()
    task, add = ray.remote(ray_io.reduce_shard).options(**opts), ray.remote(_sum).options(**opts)
    source = ray_io.pack(ds)
    fn = functools.partial(_bucket_counts, keys=keys, buckets=buckets)
    dense = functools.partial(_dense_counts, size=size)
    refs = [task.remote(source, s, e, fn, dense, ["id", "label"], 10_000) for s, e in engine.block_bounds(ds.num_rows)]
    while len(refs) > 1:
        refs = [add.remote(*refs[k:k + FAN_IN]) for k in range(0, len(refs), FAN_IN)]
    return engine.get(refs[0], "split: class histograms").reshape(classes, buckets)


def _targets(counts: np.ndarray, cuts: tuple[float, float]) -> list[list]:
    """Per class (counts: (classes, buckets)), per cut, [bucket, rank within it] or None (no row at that
    rank: every row of the class is below the cut), the ranks _stratified_codes cuts at."""
    out = []
    for per in counts:
        n, cum = int(per.sum()), np.cumsum(per)
        row = []
        for cut in cuts:
            rank = round(n * cut)
            k = int(np.searchsorted(cum, rank, side="right"))
            row.append(None if rank >= n else [k, rank - (int(cum[k - 1]) if k else 0)])
        out.append(row)
    return out


def stratified_cuts(engine: Any, ds: Any, keys: Any, classes: int, cuts: tuple[float, float]) -> tuple:
    """(hashes (classes, 2), ties [[2] per class]): the threshold (hash, (id, row)) of each class's two
    cuts (inf: none), by the two-pass selection above; keys(table) -> (hashes, class indices)."""
    import ray

    b = buckets_for(classes)
    targets = _targets(_histogram(engine, ds, keys, classes, b), cuts)
    wanted = np.unique([c * b + t[0] for c, row in enumerate(targets) for t in row if t is not None])
    hashes, ties = np.full((classes, 2), np.inf), [[("", -1), ("", -1)] for _ in range(classes)]
    if not len(wanted):
        return hashes, ties
    task, source = ray.remote(candidates_shard).options(**engine.task_options()), ray_io.pack(ds)
    found = engine.get([task.remote(source, s, e, keys, b, wanted) for s, e in engine.block_bounds(ds.num_rows)],
                       "split: the cuts' buckets")
    code, u, rows = (np.concatenate([f[k] for f in found]) for k in (0, 1, 3))
    ids = [i for f in found for i in f[2]]
    for c, row in enumerate(targets):
        for j, t in enumerate(row):
            if t is not None:  # the bucket's rows by (hash, id, row), as _stratified_codes ranks them
                hit = np.flatnonzero(code == c * b + t[0]).tolist()
                hashes[c, j], ties[c][j] = sorted((u[k], (ids[k], int(rows[k]))) for k in hit)[t[1]]
    return hashes, ties


def split_rows(engine: Any, ds: Any, cfg: Any, stratum: Any = None) -> tuple[dict, bool]:
    """split.split_rows's answer on Ray: the rule of each row's split as a per-batch function, then
    one route pass writing each split's rows."""
    if not ds.num_rows:
        return split.split_rows(ds, cfg, engine, stratum)
    share, cuts = split.source_share(ds, cfg, engine), split.cut_points((cfg.train, cfg.validation, cfg.test))
    if share is not None:
        codes_of = functools.partial(split._source_codes, seed=cfg.seed, share=share)
    elif not cfg.stratify:
        codes_of = functools.partial(split._hash_codes, seed=cfg.seed, cuts=cuts)
    else:
        classes = split.label_classes(ds, engine, stratum)
        keys = functools.partial(split._hash_and_class, seed=cfg.seed, classes=classes, stratum=stratum)
        return stratified_rows(engine, ds, keys, len(classes), cuts, chunked=cfg.chunk == "none"), False
    parts = _route(engine, ds, functools.partial(_by_table, codes_of=codes_of), cfg.chunk == "none")
    return dict(zip(split.SPLITS, parts)), share is not None


def _route(engine: Any, ds: Any, rule: Any, chunked: bool) -> list:
    """The three splits' rows by `rule`; with `chunked`, already as split's chunk map leaves whole
    documents (split.whole_documents), so that the route is the split's only write of them."""
    if not chunked:
        return ray_io.route(engine, ds, rule, ["source_split"], 3, "split")
    return ray_io.route(engine, ds, rule, ["source_split"], 3, "split", then=split.whole_documents,
                        features=split.chunked_features(ds.features))


def stratified_rows(engine: Any, ds: Any, keys: Any, classes: int, cuts: tuple[float, float],
                    chunked: bool = False) -> dict:
    """{split: rows} of a stratified split by keys(table) -> (hashes, class indices): the cuts, then a route."""
    hashes, ties = stratified_cuts(engine, ds, keys, classes, cuts)
    rule = functools.partial(_cut_codes, keys=keys, hashes=hashes, ties=ties)
    return dict(zip(split.SPLITS, _route(engine, ds, rule, chunked)))


def drop_rows(engine: Any, ds: Any, rows: list[int]) -> Any:
    """`ds` without `rows` (ascending row indices): a route pass that writes only the others."""
    if not len(rows):
        return ds
    import ray

    listed = ray.put(np.asarray(rows, dtype=np.int64))  # every block checks its rows against the one list
    return ray_io.drop_rows(engine, ds, [[listed]] * len(engine.block_bounds(ds.num_rows)), "leakage: the rows kept")
