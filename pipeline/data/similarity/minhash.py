"""MinHash near-duplicate detection, vectorized: shingles, signatures, LSH, clustering.

For N texts (shapes in the comments):
 1. Shingle hashes: every shingle hashed ONCE to a 64-bit int, in numpy over the code points of a
    whole batch of texts (no Python call per shingle): `hashes` (S,) and `offsets` (N+1,).
 2. Signatures (N, P) uint32 in datasketch's "affine32" scheme, bit-identical to datasketch's
    (signatures.py), or only their band keys where the check is exact.
 3. LSH with the band layout of datasketch's `MinHashLSH` (bands x rows from the config, or its own
    optimal choice for the threshold). `cross_duplicates` indexes the reference set in a real
    `MinHashLSH` and queries it; the self-join of `near_duplicate_pairs` groups equal bands with a
    sort instead, which yields the same candidate pairs (tested) at a fraction of the cost of
    inserting every document into the index one Python call per band. Checked exactly, the pairs
    need the signatures' band keys only (`signed_band_keys`).
 4. Candidate pairs checked with exact Jaccard of the shingle-hash sets (or the signature estimate),
    then clustered with union-find.

Shingling and shingle hashing live in pipeline/data/similarity/shingling.py, signatures and band
keys in pipeline/data/similarity/signatures.py.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

from pipeline.data.similarity.shingling import (  # noqa: F401 - part of this module's API
    GOLD,
    U64,
    _ranges,
    fmix64,
    normalize_text,
    normalized_lengths,
    shingle_hashes,
    shingles,
    text_hashes,
)
from pipeline.data.similarity.signatures import (  # noqa: F401 - part of this module's API
    band_keys,
    band_keys_from_hashes,
    hash32,
    permutations,
    signatures_from_hashes,
)

_MIN_DOCS_PER_PROC = 2000  # below this a worker process costs more than it saves
_SORTED_PER_BLOCK = 1 << 22  # shingle ranks sorted at once by ShingleSets.jaccard: 32 MiB of int64
_MERGED_RUN = 64  # ShingleSets.jaccard sorts with timsort when texts have this many shingles on average


@dataclass
class Sketch:
    """Everything MinHash knows about N texts."""

    sig: np.ndarray  # (N, P) uint32 signatures; (N, 0) where only their band keys were needed
    hashes: np.ndarray  # (S,) uint64 shingle hashes; text i owns hashes[offsets[i]:offsets[i+1]]
    offsets: np.ndarray  # (N+1,) int64


def _sketch_chunk(texts: list[str], unit: str, n: int, num_perm: int, seed: int, normalized: bool) -> Sketch:
    hashes, offsets = shingle_hashes(texts, unit, n, normalized)
    return Sketch(signatures_from_hashes(hashes, offsets, num_perm, seed), hashes, offsets)


def _as_list(texts) -> list[str]:
    """A list of str from a list, tuple or `datasets` Column (whose whole slice is a list)."""
    return texts if isinstance(texts, list) else list(texts[:])


def _processes(texts: int, num_proc: int) -> int:
    return max(1, min(num_proc, texts // _MIN_DOCS_PER_PROC))


def _in_processes(fn, procs: int, *args: list) -> list:
    """[fn(*a) for a in zip(*args)] in `procs` processes. forkserver: safe when the parent holds
    threads (Arrow's pool), unlike fork; its server imports this module once, so each worker starts
    without importing numpy again."""
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__])
    with ProcessPoolExecutor(procs, mp_context=context) as pool:
        return list(pool.map(fn, *args))


def _joined_offsets(parts: list[np.ndarray]) -> np.ndarray:
    """The offsets (N+1,) of consecutive parts' texts, from each part's own offsets."""
    shift = np.cumsum([0] + [p[-1] for p in parts[:-1]])
    return np.concatenate([np.zeros(1, np.int64)] + [p[1:] + k for p, k in zip(parts, shift)])


def _spans(texts: int, procs: int) -> list[tuple[int, int]]:
    """[start, end) of `procs` runs of consecutive texts, as many texts in each."""
    return list(itertools.pairwise(np.linspace(0, texts, procs + 1).astype(int).tolist()))


def _shingled_chunks(hashes: np.ndarray, offsets: np.ndarray, procs: int) -> tuple[list, list]:
    """The hashes and offsets of `procs` runs of consecutive texts (`_spans`)."""
    spans = _spans(len(offsets) - 1, procs)
    return [hashes[offsets[s] : offsets[e]] for s, e in spans], [offsets[s : e + 1] - offsets[s] for s, e in spans]


def _joined_signatures(parts: list[np.ndarray]) -> np.ndarray:
    """Parts' (N_i, P) signatures as one (N, P), permutation-major as each part."""
    return np.concatenate([p.T for p in parts], axis=1).T


def sketch(texts: list[str], cfg, num_proc: int = 1, normalized: bool = False) -> tuple[Sketch, int]:
    """Shingle and sign `texts` with `cfg` (a DedupConfig); returns the sketch and the number of
    processes used (normalized: see `shingle_hashes`). Each text's result depends on that text
    alone, so any split into contiguous chunks over processes gives the same arrays as one process."""
    texts = _as_list(texts)
    args = (cfg.shingle, cfg.ngram, cfg.num_perm, cfg.seed, normalized)
    procs = _processes(len(texts), num_proc)
    if procs == 1:
        return _sketch_chunk(texts, *args), 1
    chunks = [texts[s:e] for s, e in _spans(len(texts), procs)]
    parts = _in_processes(_sketch_chunk, procs, chunks, *[[x] * procs for x in args])
    return Sketch(_joined_signatures([p.sig for p in parts]), np.concatenate([p.hashes for p in parts]),
                  _joined_offsets([p.offsets for p in parts])), procs


def shingled(texts: list[str], cfg, num_proc: int = 1, normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`shingle_hashes` of `texts` with cfg's shingles, in processes as `sketch` takes them."""
    texts = _as_list(texts)
    procs = _processes(len(texts), num_proc)
    if procs == 1:
        return shingle_hashes(texts, cfg.shingle, cfg.ngram, normalized)
    chunks = [texts[s:e] for s, e in _spans(len(texts), procs)]
    parts = _in_processes(shingle_hashes, procs, chunks, [cfg.shingle] * procs, [cfg.ngram] * procs,
                          [normalized] * procs)
    return np.concatenate([h for h, _ in parts]), _joined_offsets([o for _, o in parts])


def signed(hashes: np.ndarray, offsets: np.ndarray, cfg, num_proc: int = 1) -> tuple[Sketch, int]:
    """The sketch of texts already shingled (hashes (S,), offsets (N+1,)) and the number of
    processes used: `sketch`'s, for the same texts in the same processes."""
    procs = _processes(len(offsets) - 1, num_proc)
    if procs == 1:
        return Sketch(signatures_from_hashes(hashes, offsets, cfg.num_perm, cfg.seed), hashes, offsets), 1
    parts = _in_processes(signatures_from_hashes, procs, *_shingled_chunks(hashes, offsets, procs),
                          [cfg.num_perm] * procs, [cfg.seed] * procs)
    return Sketch(_joined_signatures(parts), hashes, offsets), procs


def signed_band_keys(hashes: np.ndarray, offsets: np.ndarray, cfg, bands: int, rows: int,
                     num_proc: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """The band keys of texts already shingled (`band_keys_from_hashes`: (bands, N) keys and (N,)
    the text of each column), in processes as `signed` signs them, and the number of processes
    used: for a check that needs no signature after the LSH (exact Jaccard)."""
    procs = _processes(len(offsets) - 1, num_proc)
    if procs == 1:
        return *band_keys_from_hashes(hashes, offsets, cfg.num_perm, cfg.seed, bands, rows), 1
    parts = _in_processes(band_keys_from_hashes, procs, *_shingled_chunks(hashes, offsets, procs),
                          *[[x] * procs for x in (cfg.num_perm, cfg.seed, bands, rows)])
    texts = [order + s for (_, order), (s, _) in zip(parts, _spans(len(offsets) - 1, procs))]
    return np.concatenate([keys for keys, _ in parts], axis=1), np.concatenate(texts), procs


# ---------------------------------------------------------------- LSH


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique of a 1-d array (its distinct values, ascending) by one SIMD sort and a compare of
    neighbours: numpy 2's np.unique hashes before it sorts, ~7x the cost on 290k pair codes."""
    values = np.sort(values)
    new = np.ones(len(values), dtype=bool)
    new[1:] = values[1:] != values[:-1]
    return values[new]


# LSH weights (false positive, false negative) when candidates are checked with exact Jaccard: a
# false positive then costs one check, a false negative a missed duplicate. On 20k distinct tweets
# at threshold 0.5 and 128 permutations, datasketch's even weights give 25 x 5 and recall 0.948;
# these give 32 x 4 and recall 0.995 for 17% more candidates (bench/bench_dedup.py).
RECALL_WEIGHTS = (0.1, 0.9)


@functools.lru_cache(maxsize=16)
def lsh_params(threshold: float, num_perm: int, bands: int = 0, rows: int = 0, verify: bool = True) -> tuple[int, int]:
    """(bands, rows): the configured ones, or datasketch's `MinHashLSH` choice minimising the
    weighted false positive and false negative areas under the S-curve 1 - (1 - J^rows)^bands
    around `threshold` (weights RECALL_WEIGHTS when verified, datasketch's (0.5, 0.5) otherwise)."""
    if bands and rows:
        if bands < 2:
            raise ValueError(f"dedup.bands is {bands}: datasketch's MinHashLSH needs at least 2 bands")
        return bands, rows
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=RECALL_WEIGHTS if verify else (0.5, 0.5))
    return lsh.b, lsh.r


def _pairs_within_groups(members: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """All pairs inside consecutive groups of `members` with the given sizes: (K, 2) int64."""
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    rank = np.arange(len(members)) - starts  # position inside its group
    later = np.repeat(sizes, sizes) - rank - 1  # partners after it in the group
    left = np.repeat(np.arange(len(members)), later)
    right = left + 1 + np.arange(len(left)) - np.repeat(np.cumsum(later) - later, later)
    return np.stack([members[left], members[right]], axis=1)


def _pair_codes(members: np.ndarray, sizes: np.ndarray, n: int) -> np.ndarray:
    """i * n + j of all pairs i < j inside consecutive groups of `members` (each ascending) with
    the given sizes, as _pairs_within_groups lists them: in 32 bits when they fit (a pair is
    listed once per band the two share, so the big groups of texts sharing many bands make
    hundreds of thousands of codes, and each array of them is fresh memory to fault in)."""
    later = np.arange(len(members)) - np.repeat(np.cumsum(sizes), sizes) + 1
    later *= -1  # partners after each member in its group
    total = int(later.sum())
    index = np.int32 if max(total, len(members)) < 1 << 31 else np.int64
    code = np.uint32 if n * n <= 1 << 32 else np.uint64
    left = np.repeat(np.arange(len(members), dtype=index), later)
    right = np.arange(total, dtype=index)  # partner k of member m is member m + 1 + k - (its first k)
    right -= np.repeat((np.cumsum(later) - later - np.arange(len(members)) - 1).astype(index), later)
    out = members.astype(code)[left]
    out *= code(n)
    out += members.astype(code)[right]
    return out


def band_candidates(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Candidate pairs (K, 2) int64, i < j, sorted: texts whose signatures agree on all `rows`
    values of at least one of `bands` bands, which is what datasketch's MinHashLSH answers.

    One sort per band groups equal band keys: the text index is packed into the low `bits` bits
    of its key, so a plain (SIMD) sort of uint64 replaces an argsort. Truncating the key to its
    top 64 - bits bits can only add a candidate (two different bands colliding, chance
    2^-(64-bits) per pair and band), which the Jaccard check then removes. Only the neighbours
    with equal keys are gathered: most texts share no band with any other."""
    return candidates_of_keys(band_keys(sig, bands, rows))


def candidates_of_keys(packed: np.ndarray, texts: np.ndarray | None = None) -> np.ndarray:
    """band_candidates from the band keys (bands, N) (`band_keys`'s; overwritten), whose column j
    is text texts[j]'s (a permutation of range(N); default j): packed with that index, each band's
    keys sort the same whatever the columns' order."""
    n = packed.shape[1]
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    bits = (n - 1).bit_length()
    mask = U64((1 << bits) - 1)
    packed &= ~mask
    packed |= np.arange(n, dtype=U64) if texts is None else texts.astype(U64)
    for row in packed:  # band by band: a band's keys stay in cache (~1.4x faster than sort(axis=1))
        row.sort()
    flat = packed.ravel()
    # per band (small temporaries, in cache): key k + 1 is in key k's group, as an index into flat
    links = np.concatenate([np.flatnonzero((row[1:] ^ row[:-1]) <= mask) + k * n for k, row in enumerate(packed)])
    if not len(links):
        return np.zeros((0, 2), dtype=np.int64)
    head = np.ones(len(links), dtype=bool)  # a group's first link
    head[1:] = links[1:] != links[:-1] + 1
    sizes = np.diff(np.append(np.flatnonzero(head), len(links))) + 1
    members = (flat[_ranges(links[head], sizes)] & mask).astype(np.int64)
    codes = sorted_unique(_pair_codes(members, sizes, n)).astype(np.int64)
    return np.stack([codes // n, codes % n], axis=1)


def exact_jaccard(sk: Sketch, pairs: np.ndarray) -> np.ndarray:
    """(K,) exact Jaccard of the shingle(-hash) sets of each pair (K, 2) of sketch rows."""
    return ShingleSets(sk, pairs).jaccard(pairs)


def _hash_runs(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(U,) int64 permutation that puts equal hashes next to each other, and (U,) bool, True where
    a new hash starts in that order. One plain sort of uint64 (a SIMD sort; argsort costs ~6x
    more): each hash's index replaces its low `bits` bits. Two different hashes can then only
    interleave if their other bits agree (chance ~U^2 / 2^65 among U hashes); such runs, if any,
    are put in order by the whole hash, so the grouping is exact."""
    bits = max(1, (len(hashes) - 1).bit_length())
    mask = U64((1 << bits) - 1)
    keys = np.sort((hashes & ~mask) | np.arange(len(hashes), dtype=U64))
    order = (keys & mask).astype(np.int64)
    ordered = hashes[order]
    new = np.ones(len(hashes), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    same_top = (keys[1:] ^ keys[:-1]) <= mask
    if (new[1:] & same_top).any():
        run = np.concatenate(([0], np.cumsum(~same_top)))  # (U,) run of equal top bits
        at = np.flatnonzero(np.isin(run, run[1:][new[1:] & same_top]))
        order[at] = order[at][np.lexsort((ordered[at], run[at]))]
        ordered = hashes[order]
        new[1:] = ordered[1:] != ordered[:-1]
    return order, new


class ShingleSets:
    """The distinct shingles of some sketched texts as dense ranks (U,), sorted within each text,
    with offsets (T+1,). Built once (one sort of their hashes), they give the exact Jaccard of
    any pairs among those texts for one sort of the pairs' ranks, so the check of the candidates
    and the report's similarities share the work."""

    def __init__(self, sk: Sketch, rows: np.ndarray):
        rows = sorted_unique(rows.ravel())  # (T,) sketch rows
        self.at = np.full(len(sk.offsets) - 1, -1, dtype=np.int64)  # (N,) each sketch row's place in rows
        self.at[rows] = np.arange(len(rows))
        counts = sk.offsets[rows + 1] - sk.offsets[rows]
        hashes = sk.hashes[_ranges(sk.offsets[rows], counts)]
        order, new = _hash_runs(hashes)
        self.bits = max(1, int(new.sum()).bit_length())  # a rank fits in the low `bits` bits
        owner = np.repeat(np.arange(len(rows)), counts)[order]
        # by text, then by rank; a shingle repeated in a text counts once
        keys = sorted_unique((owner << self.bits) | (np.cumsum(new) - 1))
        self.ranks = keys & ((1 << self.bits) - 1)
        self.offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys >> self.bits, minlength=len(rows)), out=self.offsets[1:])

    def jaccard(self, pairs: np.ndarray) -> np.ndarray:
        """(K,) exact Jaccard of each pair of rows (all among `rows`). Per block of pairs, both
        texts' ranks tagged with the pair's index and sorted: a repeat is a shared shingle. Each
        text's ranks are sorted already, so the keys are runs, which a stable sort (timsort) merges
        in about linear time when they are long (~4x faster than a SIMD quicksort on long texts);
        runs shorter than _MERGED_RUN it sorts by insertion first, where the SIMD quicksort is
        ~2x faster (tweets). Keys fit in 32 bits when a block's pair indices fit in 32 - `bits`
        bits, and a sort of uint32 costs about half that of int64."""
        pos = self.at[pairs].reshape(-1, 2)  # (K, 2) into offsets
        size = self.offsets[pos + 1] - self.offsets[pos]  # (K, 2) distinct shingles per text
        total = size.sum(axis=1)  # (K,) at least 2: a sketched text has a shingle
        shared = np.zeros(len(pos), dtype=np.int64)
        narrow = self.bits <= 24  # blocks of at least 2^8 pairs in 32-bit keys
        kind = "stable" if total.sum() >= _MERGED_RUN * 2 * len(pos) else "quicksort"
        block = max(1, min(_SORTED_PER_BLOCK // max(1, int(total.max(initial=0))),
                           1 << ((32 if narrow else 62) - self.bits)))
        dtype = np.uint32 if narrow else np.int64
        ranks = self.ranks.astype(dtype)
        for s in range(0, len(pos), block):
            p, sz, n = pos[s : s + block], size[s : s + block], total[s : s + block]
            src = _ranges(self.offsets[p].ravel(), sz.ravel())  # text i's ranks, then text j's
            keys = (np.repeat(np.arange(len(p), dtype=dtype), n) << dtype(self.bits)) | ranks[src]
            keys.sort(kind=kind)
            repeat = keys[1:] == keys[:-1]  # a pair's last key never equals the next pair's first
            shared[s : s + block] = np.add.reduceat(repeat, np.cumsum(n) - n, dtype=np.int64)
        return shared / (total - shared)


def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """(K,) fraction of equal signature values: the MinHash estimate of each pair's Jaccard."""
    if len(pairs) == 0:
        return np.zeros(0)
    return (sig[pairs[:, 0]] == sig[pairs[:, 1]]).mean(axis=1)


# ---------------------------------------------------------------- clustering


def union_find(n: int, pairs: np.ndarray) -> np.ndarray:
    """(n,) cluster label of each item: the smallest index in its connected component.

    In numpy, no Python call per pair: each round hooks the larger label of every pair's two
    labels onto the smaller, then jumps pointers until every label is a root. Labels only ever
    point to a smaller index of the same component, and the rounds stop when both ends of every
    pair share a root, which is then the component's smallest index (the only one that is its own
    label)."""
    labels = np.arange(n, dtype=np.int64)
    i, j = pairs[:, 0], pairs[:, 1]
    while not np.array_equal(labels[i], labels[j]):
        li, lj = labels[i], labels[j]
        np.minimum.at(labels, np.maximum(li, lj), np.minimum(li, lj))
        while not np.array_equal(labels[labels], labels):
            labels = labels[labels]
    return labels


@dataclass
class PairResult:
    pairs: np.ndarray  # (K, 2) int64 similar pairs i < j (checked)
    similarity: np.ndarray  # (K,) their Jaccard (exact when verified, else estimated)
    candidates: int  # candidate pairs from LSH before the check
    bands: int
    rows: int
    sets: ShingleSets | None  # the candidates' shingle sets when verified: more exact Jaccard cheaply


def near_duplicate_pairs(sk: Sketch, cfg, threshold: float | None = None, keys: tuple | None = None) -> PairResult:
    """LSH candidates among the sketched texts, kept where their Jaccard >= threshold: exact when
    cfg.verify (false positives dropped for sure), otherwise the signature estimate. keys: the
    texts' band keys for lsh_params' bands at this threshold and the text of each of their columns
    (`signed_band_keys`), when the sketch keeps no signatures (the exact check needs none)."""
    threshold = cfg.threshold if threshold is None else threshold
    b, r = lsh_params(threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    cand = candidates_of_keys(*keys) if keys is not None else band_candidates(sk.sig, b, r)
    sets = ShingleSets(sk, cand) if cfg.verify else None
    sim = sets.jaccard(cand) if sets is not None else estimated_jaccard(sk.sig, cand)
    ok = sim >= threshold - 1e-12
    return PairResult(cand[ok], sim[ok], len(cand), b, r, sets)


def _sharing_a_band(sig: np.ndarray, other: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(N,) bool: rows of `sig` that agree with some row of `other` on a whole band."""
    mine, theirs = band_keys(sig, bands, rows), band_keys(other, bands, rows)
    return np.any([np.isin(mine[k], theirs[k]) for k in range(bands)], axis=0)


def cross_duplicates(
    reference_texts: list[str], query_texts: list[str], cfg, threshold: float, num_proc: int = 1
) -> list[tuple[int, int, float]]:
    """For each query text with a near-duplicate among the reference texts (Jaccard >= threshold):
    (query_index, reference_index, jaccard) of its most similar one (ties: smallest reference index),
    sorted by query index. Used by the split stage to find validation/test texts leaking from train.

    The reference texts go into a datasketch `MinHashLSH` and every query text is looked up in it.
    Texts of either side that share no whole band with the other side can never meet in the index,
    so they are left out of it (a vectorized pre-pass); the answers are the same.
    """
    reference_texts, query_texts = _as_list(reference_texts), _as_list(query_texts)
    if not reference_texts or not query_texts:
        return []
    from datasketch import LeanMinHash, MinHashLSH

    ref, _ = sketch(reference_texts, cfg, num_proc)
    qry, _ = sketch(query_texts, cfg, num_proc)
    b, r = lsh_params(threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    lsh = MinHashLSH(num_perm=cfg.num_perm, params=(b, r))
    lean = functools.partial(LeanMinHash, seed=cfg.seed, scheme="affine32")
    with lsh.insertion_session() as session:
        for i in np.flatnonzero(_sharing_a_band(ref.sig, qry.sig, b, r)).tolist():
            session.insert(i, lean(hashvalues=ref.sig[i]), check_duplication=False)
    found = [(q, i) for q in np.flatnonzero(_sharing_a_band(qry.sig, ref.sig, b, r)).tolist()
             for i in lsh.query(lean(hashvalues=qry.sig[q]))]
    if not found:
        return []
    pairs = np.array(found, dtype=np.int64)  # (K, 2) query, reference
    both = Sketch(np.concatenate([ref.sig, qry.sig]), np.concatenate([ref.hashes, qry.hashes]),
                  np.concatenate([ref.offsets, ref.offsets[-1] + qry.offsets[1:]]))
    joint = np.stack([pairs[:, 1], pairs[:, 0] + len(reference_texts)], axis=1)  # rows of `both`
    sim = exact_jaccard(both, joint) if cfg.verify else estimated_jaccard(both.sig, joint)
    best: dict[int, tuple[float, int]] = {}
    for (q, i), s in zip(pairs.tolist(), sim.tolist()):
        if s >= threshold - 1e-12 and (q not in best or (-s, i) < (-best[q][0], best[q][1])):
            best[q] = (s, i)
    return [(q, i, s) for q, (s, i) in sorted(best.items())]
