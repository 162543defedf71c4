"""The bodies of the Ray engine's tasks (engine_ray.py and shuffle.py submit them; they run on Ray workers).

Dedup's shuffle, as shuffle._verified_pairs chains them (N texts in `nb` blocks,
`parts` shuffle partitions, global text indices, block k holding texts among starts[k]:starts[k+1]):
  _sketch_block (per block)       -> its Sketch and its rows (stay where they were made) + (band, key,
                                     text) triples hash-partitioned by band key (dedup sketches the
                                     rows of a block that are not an exact copy of a smaller row);
  _band_pairs (per band partition) -> candidate pair codes i * N + j, hash-partitioned by pair;
  _pairs_and_rows (per pair part.) -> its distinct pairs (K, 2) and, per block, the rows they name;
  _take_rows (per block)           -> for each pair partition, the sub-sketch of only those rows;
  _verify (per pair partition)     -> the pairs at Jaccard >= threshold, from those sub-sketches.
So a verification task receives the sketches of the texts of its pairs and nothing else, never a
block's whole sketch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.data.similarity import minhash
from pipeline.data.similarity.shingling import U64, fmix64


def apply_batch(table: Any, fn: Any, removed: list, schema: Any) -> Any:
    """One batch as `datasets.map(batched=True)` makes it: fn's columns replace or follow the others."""
    import pyarrow as pa

    batch = table.to_pydict()
    out = {k: v for k, v in batch.items() if k not in removed}
    out.update(fn(batch))
    return pa.table({name: out[name] for name in schema.names}).cast(schema)


def _partition_of(keys: np.ndarray, parts: int) -> np.ndarray:
    return (fmix64(keys.astype(U64)) % U64(parts)).astype(np.int64)


def _one_or_list(out: list) -> Any:
    """A task with num_returns=1 returns its value itself, not a list of one."""
    return out if len(out) > 1 else out[0]


def as_list(refs: Any) -> list:
    """The driver's side of _one_or_list: a `.remote()` call's refs as a list, num_returns=1 or more."""
    return refs if isinstance(refs, list) else [refs]


def _sketch_block(texts: list[str], at: np.ndarray, cfg: Any, bands: int, rows: int, parts: int, normalized: bool) -> list:
    """[the block's Sketch, `at`, then per partition an (M, 3) uint64 array of (band, key, text index)]:
    `at` (M,) the texts' global indices, ascending (dedup sketches some of a block's rows, so the
    block's rows travel beside its Sketch: _take_rows maps global rows to sketch positions with it)."""
    sk = minhash._sketch_chunk(texts, cfg.shingle, cfg.ngram, cfg.num_perm, cfg.seed, normalized)
    keys = minhash.band_keys(sk.sig, bands, rows)  # (bands, m)
    band = np.repeat(np.arange(bands, dtype=U64), len(texts))
    row = np.tile(np.asarray(at, dtype=U64), bands)
    triples = np.stack([band, keys.ravel(), row], axis=1)
    where = _partition_of(triples[:, 1] ^ triples[:, 0], parts)
    return [sk, np.asarray(at, dtype=np.int64), *[triples[where == p] for p in range(parts)]]


def _band_pairs(n: int, parts: int, split_at: int, *triples: np.ndarray) -> Any:
    """Candidate pairs i < j of one band-key partition (texts equal on a whole band), as pair codes
    i * n + j split by a hash of the code into `parts` (a pair found in several bands meets itself);
    with split_at > 0 only the pairs across it (i < split_at <= j)."""
    t = np.concatenate(triples) if triples else np.zeros((0, 3), dtype=U64)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]  # by band, key, then text index
    head = np.ones(len(t), dtype=bool)
    head[1:] = (t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1])
    starts = np.flatnonzero(head)
    sizes = np.diff(np.append(starts, len(t)))
    members = t[:, 2].astype(np.int64)[np.repeat(sizes > 1, sizes)]
    pairs = minhash._pairs_within_groups(members, sizes[sizes > 1]) if (sizes > 1).any() else np.zeros((0, 2), np.int64)
    if split_at:
        pairs = pairs[(pairs[:, 0] < split_at) & (pairs[:, 1] >= split_at)]
    codes = np.unique(pairs[:, 0] * n + pairs[:, 1])
    where = _partition_of(codes, parts)
    return _one_or_list([codes[where == p] for p in range(parts)])


def block_of(rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(M,) the block of each global row, block k holding rows starts[k]:starts[k + 1]."""
    return np.searchsorted(starts, rows, side="right") - 1


def rows_by_block(pairs: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """Per block, the distinct rows (global indices, ascending) that `pairs` (K, 2) name in it."""
    rows = np.unique(pairs)
    where = block_of(rows, starts)
    return [rows[where == k] for k in range(len(starts) - 1)]


def _pairs_and_rows(n: int, starts: np.ndarray, *codes: np.ndarray) -> list:
    """[the distinct candidate pairs (K, 2) of one pair partition, then per block the rows they name]."""
    found = np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)
    pairs = np.stack([found // n, found % n], axis=1) if len(found) else np.zeros((0, 2), dtype=np.int64)
    return [pairs, *rows_by_block(pairs, starts)]


def _take(sk: minhash.Sketch, local: np.ndarray) -> minhash.Sketch:
    """The sketch of rows `local` (ascending indices into `sk`)."""
    lengths = sk.offsets[local + 1] - sk.offsets[local]
    offsets = np.zeros(len(local) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return minhash.Sketch(sk.sig[local], sk.hashes[minhash._ranges(sk.offsets[local], lengths)], offsets)


def _take_rows(sk: minhash.Sketch, at: np.ndarray, *wanted: np.ndarray) -> Any:
    """Per consumer, the sub-sketch of the rows (global, ascending) it wants of this block. `at`: the
    block's sketched rows (global, ascending; the wanted ones are among them)."""
    return _one_or_list([_take(sk, np.searchsorted(at, rows)) for rows in wanted])


def _concat(parts: tuple) -> minhash.Sketch:
    """One sketch of the rows of `parts` in their order (blocks in order, rows ascending in each)."""
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return minhash.Sketch(np.concatenate([p.sig for p in parts]), np.concatenate([p.hashes for p in parts]), offsets)


def sketch_bytes(sk: minhash.Sketch) -> int:
    return sk.sig.nbytes + sk.hashes.nbytes + sk.offsets.nbytes


def _jaccard_of(pairs: np.ndarray, subs: tuple, verify: bool = True) -> np.ndarray:
    """(K,) Jaccard of pairs (global rows) from the sub-sketches of exactly their distinct rows."""
    rows, sk = np.unique(pairs), _concat(subs)
    local = np.searchsorted(rows, pairs)
    if not verify:
        return minhash.estimated_jaccard(sk.sig, local)
    return minhash.ShingleSets(sk, local).jaccard(local)


def _verify(cfg: Any, threshold: float, pairs: np.ndarray, *subs: minhash.Sketch) -> tuple:
    """(verified pairs (K, 2), their Jaccard (K,), [candidates, verified, sketch bytes received]) of
    one pair partition, kept as near_duplicate_pairs keeps them: Jaccard >= threshold (exact when
    cfg.verify)."""
    sim = _jaccard_of(pairs, subs, cfg.verify) if len(pairs) else np.zeros(0)
    ok = sim >= threshold - 1e-12
    return pairs[ok], sim[ok], [len(pairs), int(ok.sum()), sum(sketch_bytes(s) for s in subs)]


def _first_labels(n: int) -> np.ndarray:
    """(n,) each node its own label: min-label propagation's start."""
    return np.arange(n, dtype=np.int64)


def _lower_labels(labels: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(n,) each node's label lowered to the smallest label among its neighbours in this shard."""
    out = labels.copy()
    i, j = edges[:, 0], edges[:, 1]
    np.minimum.at(out, i, labels[j])
    np.minimum.at(out, j, labels[i])
    return out


def _merge_labels(labels: np.ndarray, *proposals: np.ndarray) -> tuple:
    """The shards' labels min-reduced, then pointer-jumped (a label always names a smaller node of
    the same component); and whether anything changed (at the fixed point each component carries
    its smallest index, as minhash.union_find gives)."""
    new = np.minimum.reduce([labels, *proposals]) if proposals else labels.copy()
    while not np.array_equal(new[new], new):
        new = new[new]
    return new, not np.array_equal(new, labels)
