"""MinHash near-duplicate detection, vectorized: shingles, signatures, LSH, clustering.

For N texts (shapes in the comments):
 1. Shingle hashes: every shingle hashed ONCE to a 64-bit int, in numpy over the code points of a
    whole batch of texts (no Python call per shingle): `hashes` (S,) and `offsets` (N+1,).
 2. Signatures in datasketch's "affine32" scheme for all permutations at once:
    sig[d, p] = min over shingles h of d of (a_p * fmix32(h mod 2^32) + b_p) mod 2^32, (N, P) uint32;
    bit-identical to `datasketch.MinHash(num_perm=P, seed=seed, hashfunc=<h mod 2^32>)` fed the same
    shingles (tested), so signatures can go straight into datasketch objects.
 3. LSH with the band layout of datasketch's `MinHashLSH` (bands x rows from the config, or its own
    optimal choice for the threshold). `cross_duplicates` indexes the reference set in a real
    `MinHashLSH` and queries it; the self-join of `near_duplicate_pairs` groups equal bands with a
    sort instead, which yields the same candidate pairs (tested) at a fraction of the cost of
    inserting every document into the index one Python call per band.
 4. Candidate pairs checked with exact Jaccard of the shingle-hash sets (or the signature estimate),
    then clustered with union-find.

Words are maximal runs of `str.isalnum()` characters and `_` in the casefolded text (what `\\w+`
matches); a text with fewer than n words gives one shingle of all its words, and a text without
any word character one shingle of its whole normalized text.
"""

from __future__ import annotations

import functools
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np

_U64 = np.uint64
_K = 0x100000001B3  # odd multiplier of the polynomial code-point hash (invertible mod 2^64)
_K_INV = pow(_K, -1, 1 << 64)
_GOLD = _U64(0x9E3779B97F4A7C15)  # chains word hashes into an n-gram hash
_BATCH_CHARS = 1 << 21  # code points hashed per batch: bounds memory (~10 arrays of 8 bytes each)
_DOCS_PER_BLOCK = 1024  # signature block: (1024, P) uint32 accumulators stay in cache
_MIN_DOCS_PER_PROC = 2000  # below this a worker process costs more than it saves
_WORD = re.compile(r"\w+")


def normalize_text(text: str) -> str:
    """Casefolded, whitespace collapsed: the key of exact duplicates and of char shingles."""
    return " ".join(text.casefold().split())


def shingles(text: str, unit: str, n: int) -> list[str]:
    """The shingles of one text as strings: the readable definition `shingle_hashes` implements."""
    if unit == "char":
        s = normalize_text(text)
        return [s] if len(s) < n else [s[i : i + n] for i in range(len(s) - n + 1)]
    words = _WORD.findall(text.casefold())
    if not words:
        return [normalize_text(text)]
    return [" ".join(words)] if len(words) < n else [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


# ---------------------------------------------------------------- shingle hashes


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit (wraps mod 2^64)."""
    h = h ^ (h >> _U64(33))
    h = h * _U64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> _U64(33))
    h = h * _U64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> _U64(33))


@functools.cache
def _bmp_word_chars() -> np.ndarray:
    """(65536,) bool: which Basic-Multilingual-Plane code points `\\w` matches, by one `re.sub`
    over all of them (in C) that turns word characters into code point 1 (itself no word char)."""
    marked = re.sub(r"\w", "\x01", "".join(map(chr, range(65536))))
    table = np.frombuffer(marked.encode("utf-32-le", "surrogatepass"), dtype=np.uint32) == 1
    table[1] = False
    return table


def _is_word_char(cp: np.ndarray) -> np.ndarray:
    out = _bmp_word_chars()[np.minimum(cp, 65535)]
    high = cp > 65535  # emoji, rare scripts: look up only the distinct ones
    if high.any():
        uniq, inv = np.unique(cp[high], return_inverse=True)
        out[high] = np.array([bool(_WORD.match(chr(c))) for c in uniq.tolist()], dtype=bool)[inv]
    return out


@functools.lru_cache(maxsize=2)
def _powers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """K^j and K^-j mod 2^64 for j < size (size a power of two, so a process computes few)."""
    powers = np.full(size, _K, dtype=_U64)
    inverse = np.full(size, _K_INV, dtype=_U64)
    powers[0] = inverse[0] = 1
    return np.cumprod(powers), np.cumprod(inverse)


class _SpanHasher:
    """Hash any span [s, e) of a code-point array in O(1) after one prefix sum.

    hash(s, e) = fmix64(sum_{j<e-s} cp[s+j] * K^j + len * GOLD): prefix sums of cp[j] * K^j, shifted
    to position 0 by K^-s (K odd, so invertible mod 2^64); all arithmetic wraps mod 2^64.
    """

    def __init__(self, cp: np.ndarray):
        n = len(cp)
        powers, self.inv = _powers(1 << n.bit_length())  # at least n+1 entries
        self.prefix = np.zeros(n + 1, dtype=_U64)  # (C+1,) sum_{j<i} cp[j] * K^j
        np.cumsum(cp * powers[:n], out=self.prefix[1:])

    def __call__(self, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        raw = (self.prefix[e] - self.prefix[s]) * self.inv[s]
        return _fmix64(raw + (e - s).astype(_U64) * _GOLD)


def _code_points(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All texts' code points in one (C,) uint32 array, and each text's start (N+1,)."""
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in texts], out=starts[1:])
    cp = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # lone surrogates too
    return cp, starts


def text_hashes(texts: list[str]) -> np.ndarray:
    """(N,) uint64 hash of each whole text: equal texts, equal hashes."""
    cp, starts = _code_points(texts)
    return _SpanHasher(cp)(starts[:-1], starts[1:])


def _word_ngrams(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    folded = [t.casefold() for t in texts]
    cp, starts = _code_points(folded)
    span = _SpanHasher(cp)
    word = _is_word_char(cp)
    prev = np.concatenate(([False], word[:-1]))
    nxt = np.concatenate((word[1:], [False]))
    prev[starts[:-1][starts[:-1] < len(cp)]] = False  # a word never continues across texts
    nxt[starts[1:][starts[1:] > 0] - 1] = False
    w_start, w_end = np.flatnonzero(word & ~prev), np.flatnonzero(word & ~nxt) + 1
    w_hash = span(w_start, w_end)  # (W,) one hash per word
    w_first = np.searchsorted(w_start, starts)  # (N+1,) index of each text's first word
    n_words = np.diff(w_first)
    count = np.maximum(n_words - n + 1, 1)  # shingles per text
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    doc = np.repeat(np.arange(len(texts)), count)
    first = w_first[:-1][doc] + np.arange(offsets[-1]) - offsets[:-1][doc]  # first word of each shingle
    width = np.minimum(n_words, n)[doc]  # words per shingle (fewer for short texts)
    h = np.zeros(len(doc), dtype=_U64)
    for k in range(n):
        m = k < width
        h[m] = _fmix64(h[m] * _GOLD + w_hash[first[m] + k])
    empty = np.flatnonzero(n_words == 0)  # no word character: the whole normalized text
    if len(empty):
        h[offsets[empty]] = text_hashes([normalize_text(texts[i]) for i in empty])
    return h, offsets


def _char_ngrams(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    cp, starts = _code_points([normalize_text(t) for t in texts])  # per text in C: cheaper than numpy
    lengths = np.diff(starts)
    count = np.maximum(lengths - n + 1, 1)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    doc = np.repeat(np.arange(len(texts)), count)
    s = starts[:-1][doc] + np.arange(offsets[-1]) - offsets[:-1][doc]
    return _SpanHasher(cp)(s, np.minimum(s + n, starts[1:][doc])), offsets


def shingle_hashes(texts: list[str], unit: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every shingle (S,) uint64 and per-text offsets (N+1,): text i owns
    hashes[offsets[i]:offsets[i+1]] (at least one). Equal shingles (see `shingles`) hash equally."""
    if not texts:
        return np.zeros(0, dtype=_U64), np.zeros(1, dtype=np.int64)
    fn = _char_ngrams if unit == "char" else _word_ngrams
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    batch = (ends - 1) // _BATCH_CHARS  # texts that start in one window of code points hash together
    bounds = [0, *(np.flatnonzero(np.diff(batch)) + 1).tolist(), len(texts)]
    parts, offsets = [], [np.zeros(1, dtype=np.int64)]
    for s, e in zip(bounds[:-1], bounds[1:]):
        h, off = fn(texts[s:e], n)
        parts.append(h)
        offsets.append(off[1:] + offsets[-1][-1])
    return np.concatenate(parts), np.concatenate(offsets)


# ---------------------------------------------------------------- signatures


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutation parameters: a (odd) and b, two (P,) uint32 arrays, drawn
    as `datasketch.MinHash(num_perm, seed)` draws them (a test keeps the two equal), without
    importing datasketch, whose import (scipy) would cost every worker process seconds."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, as datasketch applies it before its permutations."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def hash32(hashes: np.ndarray) -> np.ndarray:
    """The 32-bit shingle hash the signatures are built from (what datasketch's `hashfunc` returns)."""
    return (hashes & _U64(0xFFFFFFFF)).astype(np.uint32)


def signatures_from_hashes(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """(N, P) uint32 MinHash signatures from shingle hashes (S,) and offsets (N+1,).

    Texts are sorted by shingle count and processed in blocks padded to the block's longest text
    (padding repeats a text's last shingle, which leaves its minimum unchanged); per shingle position
    one (block, P) multiply-add-minimum, so every permutation runs at once in numpy.
    """
    a, b = permutations(num_perm, seed)
    h = _fmix32(hash32(hashes))
    counts = np.diff(offsets)
    order = np.argsort(counts, kind="stable")
    sig = np.empty((len(counts), num_perm), dtype=np.uint32)
    for s in range(0, len(order), _DOCS_PER_BLOCK):
        idx = order[s : s + _DOCS_PER_BLOCK]
        c = counts[idx]
        pos = offsets[idx][:, None] + np.minimum(np.arange(c[-1]), c[:, None] - 1)  # (m, longest)
        block = h[pos]
        acc = np.full((len(idx), num_perm), 0xFFFFFFFF, dtype=np.uint32)
        tmp = np.empty_like(acc)
        for k in range(block.shape[1]):
            np.multiply(block[:, k, None], a, out=tmp)
            np.add(tmp, b, out=tmp)
            np.minimum(acc, tmp, out=acc)
        sig[idx] = acc
    return sig


@dataclass
class Sketch:
    """Everything MinHash knows about N texts."""

    sig: np.ndarray  # (N, P) uint32 signatures
    hashes: np.ndarray  # (S,) uint64 shingle hashes; text i owns hashes[offsets[i]:offsets[i+1]]
    offsets: np.ndarray  # (N+1,) int64


def _sketch_chunk(texts: list[str], unit: str, n: int, num_perm: int, seed: int) -> Sketch:
    hashes, offsets = shingle_hashes(texts, unit, n)
    return Sketch(signatures_from_hashes(hashes, offsets, num_perm, seed), hashes, offsets)


def _as_list(texts) -> list[str]:
    """A list of str from a list, tuple or `datasets` Column (whose whole slice is a list)."""
    return texts if isinstance(texts, list) else list(texts[:])


def sketch(texts: list[str], cfg, num_proc: int = 1) -> tuple[Sketch, int]:
    """Shingle and sign `texts` with `cfg` (a DedupConfig); returns the sketch and the number of
    processes used. Each text's result depends on that text alone, so any split into contiguous
    chunks over processes gives the same arrays as one process."""
    texts = _as_list(texts)
    args = (cfg.shingle, cfg.ngram, cfg.num_perm, cfg.seed)
    procs = max(1, min(num_proc, len(texts) // _MIN_DOCS_PER_PROC))
    if procs == 1:
        return _sketch_chunk(texts, *args), 1
    bounds = np.linspace(0, len(texts), procs + 1).astype(int)
    chunks = [texts[s:e] for s, e in zip(bounds[:-1], bounds[1:])]
    # forkserver: safe when the parent holds threads (Arrow's pool), unlike fork; its server
    # imports this module once, so each worker starts without importing numpy again
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__])
    with ProcessPoolExecutor(procs, mp_context=context) as pool:
        parts = list(pool.map(_sketch_chunk, chunks, *[[x] * procs for x in args]))
    shift = np.cumsum([0] + [len(p.hashes) for p in parts[:-1]])
    offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + k for p, k in zip(parts, shift)])
    return Sketch(np.concatenate([p.sig for p in parts]), np.concatenate([p.hashes for p in parts]), offsets), procs


# ---------------------------------------------------------------- LSH


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


def _band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, N) uint64 hash of each text's bands sig[:, k*rows:(k+1)*rows] (datasketch's
    hashranges). Equal bands give equal keys; unequal ones collide with chance ~2^-64."""
    cols = sig[:, : bands * rows].reshape(len(sig), bands, rows)
    key = np.zeros((len(sig), bands), dtype=_U64)
    for j in range(rows):
        key = _fmix64(key * _GOLD + cols[:, :, j])
    return np.ascontiguousarray(key.T)


def _pairs_within_groups(members: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """All pairs inside consecutive groups of `members` with the given sizes: (K, 2) int64."""
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    rank = np.arange(len(members)) - starts  # position inside its group
    later = np.repeat(sizes, sizes) - rank - 1  # partners after it in the group
    left = np.repeat(np.arange(len(members)), later)
    right = left + 1 + np.arange(len(left)) - np.repeat(np.cumsum(later) - later, later)
    return np.stack([members[left], members[right]], axis=1)


def band_candidates(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Candidate pairs (K, 2) int64, i < j, sorted: texts whose signatures agree on all `rows`
    values of at least one of `bands` bands, which is what datasketch's MinHashLSH answers.

    One sort per band groups equal band keys: the text index is packed into the low `bits` bits
    of its key, so a plain (SIMD) sort of uint64 replaces an argsort. Truncating the key to its
    top 64 - bits bits can only add a candidate (two different bands colliding, chance
    2^-(64-bits) per pair and band), which the Jaccard check then removes."""
    n = len(sig)
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    bits = (n - 1).bit_length()
    mask = _U64((1 << bits) - 1)
    packed = np.sort((_band_keys(sig, bands, rows) & ~mask) | np.arange(n, dtype=_U64), axis=1)
    head = np.ones(packed.shape, dtype=bool)  # (bands, N): starts a group of equal keys
    head[:, 1:] = (packed[:, 1:] >> _U64(bits)) != (packed[:, :-1] >> _U64(bits))
    starts = np.flatnonzero(head.ravel())
    sizes = np.diff(np.append(starts, head.size))
    if not (sizes > 1).any():
        return np.zeros((0, 2), dtype=np.int64)
    members = (packed.ravel() & mask).astype(np.int64)[np.repeat(sizes > 1, sizes)]
    pairs = _pairs_within_groups(members, sizes[sizes > 1])  # ascending index inside a group: i < j
    codes = np.unique(pairs[:, 0] * n + pairs[:, 1])
    return np.stack([codes // n, codes % n], axis=1)


def exact_jaccard(sk: Sketch, pairs: np.ndarray) -> np.ndarray:
    """(K,) exact Jaccard of the shingle(-hash) sets of each pair, vectorized over all pairs:
    sort the concatenated unique hashes of both texts per pair; a repeat marks a shared shingle."""
    if len(pairs) == 0:
        return np.zeros(0)
    texts = np.unique(pairs)
    uniq, uoff = _unique_per_text(sk, texts)
    pos = np.searchsorted(texts, pairs)  # (K, 2) rows into uniq/uoff
    size = uoff[pos + 1] - uoff[pos]  # (K, 2) distinct shingles per text
    per_pair = size.sum(axis=1)
    pair_of = np.repeat(np.arange(len(pairs)), per_pair)
    src = _ranges(uoff[pos].ravel(), size.ravel())  # positions in uniq: text i's, then text j's
    rank = np.unique(uniq, return_inverse=True)[1].ravel()  # dense rank of each hash, < len(uniq)
    keys = np.sort(pair_of * len(uniq) + rank[src])  # grouped by pair, then by shingle
    dup = keys[1:] == keys[:-1]  # the same shingle in both texts of a pair
    shared = np.bincount(keys[1:][dup] // len(uniq), minlength=len(pairs))
    return shared / (per_pair - shared)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each start s and length l, without a Python loop."""
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())


def _unique_per_text(sk: Sketch, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct shingle hashes of the given texts, concatenated (U,), with offsets (T+1,)."""
    counts = sk.offsets[texts + 1] - sk.offsets[texts]
    owner = np.repeat(np.arange(len(texts)), counts)
    src = _ranges(sk.offsets[texts], counts)
    order = np.lexsort((sk.hashes[src], owner))  # by text, then by hash
    vals, owner = sk.hashes[src][order], owner[order]
    keep = np.concatenate(([True], (vals[1:] != vals[:-1]) | (owner[1:] != owner[:-1])))
    uoff = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=len(texts)), out=uoff[1:])
    return vals[keep], uoff


def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """(K,) fraction of equal signature values: the MinHash estimate of each pair's Jaccard."""
    if len(pairs) == 0:
        return np.zeros(0)
    return (sig[pairs[:, 0]] == sig[pairs[:, 1]]).mean(axis=1)


# ---------------------------------------------------------------- clustering


def union_find(n: int, pairs: np.ndarray) -> np.ndarray:
    """(n,) cluster label of each item: the smallest index in its connected component."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    for i, j in pairs.tolist():
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)  # the smaller root wins: labels independent of pair order
    labels = np.arange(n, dtype=np.int64)
    touched = np.unique(pairs)
    labels[touched] = [find(i) for i in touched.tolist()]
    return labels


@dataclass
class PairResult:
    pairs: np.ndarray  # (K, 2) int64 similar pairs i < j (checked)
    similarity: np.ndarray  # (K,) their Jaccard (exact when verified, else estimated)
    candidates: int  # candidate pairs from LSH before the check
    bands: int
    rows: int


def near_duplicate_pairs(sk: Sketch, cfg, threshold: float | None = None) -> PairResult:
    """LSH candidates among the sketched texts, kept where their Jaccard >= threshold: exact when
    cfg.verify (false positives dropped for sure), otherwise the signature estimate."""
    threshold = cfg.threshold if threshold is None else threshold
    b, r = lsh_params(threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    cand = band_candidates(sk.sig, b, r)
    sim = exact_jaccard(sk, cand) if cfg.verify else estimated_jaccard(sk.sig, cand)
    ok = sim >= threshold - 1e-12
    return PairResult(cand[ok], sim[ok], len(cand), b, r)


def _sharing_a_band(sig: np.ndarray, other: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(N,) bool: rows of `sig` that agree with some row of `other` on a whole band."""
    mine, theirs = _band_keys(sig, bands, rows), _band_keys(other, bands, rows)
    return np.any([np.isin(mine[k], theirs[k]) for k in range(bands)], axis=0)


def cross_duplicates(
    reference_texts: list[str], query_texts: list[str], cfg, threshold: float
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

    ref, _ = sketch(reference_texts, cfg, cfg.num_proc)
    qry, _ = sketch(query_texts, cfg, cfg.num_proc)
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
