"""MinHash signatures and their LSH band keys, vectorized, from shingle hashes (shingling.py).

sig[d, p] = min over shingles h of d of (a_p * fmix32(h mod 2^32) + b_p) mod 2^32, (N, P) uint32, for
all permutations at once: datasketch's "affine32" scheme, bit-identical to
`datasketch.MinHash(num_perm=P, seed=seed, hashfunc=<h mod 2^32>)` fed the same shingles (tested), so
signatures can go straight into datasketch objects. Short texts are signed shingle position by
shingle position over many texts at once, long ones text by text. A band's key (`band_keys`) is one
64-bit mix of its values; the exact check needs the keys only (`band_keys_from_hashes`), not the
signatures in the texts' order. LSH, the exact check and clustering live in minhash.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from pipeline.data.similarity.shingling import GOLD, U64, fmix64

_SIGNATURE_BLOCK = 1 << 20  # uint32 values per signature block: 4 MiB; a block of 2^17 costs ~3x more
# (each ufunc call loops over P rows), one of 2^22 ~2x (out of cache): bench/results/dedup.md
_POSITIONS = 64  # texts of at most this many shingles are signed by position
_POSITION_BLOCK = 1 << 19  # uint32 values per (P, texts) block signed by position (2 MiB)
_UFUNC_BUFFER = 1024  # numpy's ufunc buffer while signing by position (_ufunc_buffer)
_FMIX_BLOCK = 1 << 16  # uint32 values mixed at a time by _fmix32
_KEYS_BLOCK = 1 << 16  # band keys (uint64) summed at a time by band_keys: 512 KiB


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutation parameters: a (odd) and b, two (P,) uint32 arrays, drawn
    as `datasketch.MinHash(num_perm, seed)` draws them (a test keeps the two equal), without
    importing datasketch, whose import (scipy) would cost every worker process seconds."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def _fmix32(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, as datasketch applies it before its permutations: into `out`
    (a new array unless given; may be h itself), in blocks that stay in cache with one small
    scratch array (fresh memory costs a page fault per 4 KiB here, more than the arithmetic)."""
    if out is None:
        out = h.copy()
    elif out is not h:
        np.copyto(out, h)
    shifted = np.empty(min(len(out), _FMIX_BLOCK), dtype=np.uint32)
    for s in range(0, len(out), _FMIX_BLOCK):
        x = out[s : s + _FMIX_BLOCK]
        t = shifted[: len(x)]
        for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
            np.right_shift(x, np.uint32(shift), out=t)
            x ^= t
            x *= np.uint32(mult)
        np.right_shift(x, np.uint32(16), out=t)
        x ^= t
    return out


def hash32(hashes: np.ndarray) -> np.ndarray:
    """The 32-bit shingle hash the signatures are built from (what datasketch's `hashfunc` returns)."""
    return hashes.astype(np.uint32)  # the low 32 bits: a cast to a narrower unsigned type wraps


def signatures_from_hashes(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """(N, P) uint32 MinHash signatures from shingle hashes (S,) and offsets (N+1,); a text
    without shingles keeps datasketch's empty value 2^32 - 1 everywhere. The array is stored
    permutation-major (Fortran order: `.T` is C-contiguous (P, N)), as it is computed and as the
    band keys read it.

    Texts of at most _POSITIONS shingles are signed by shingle position (`_sign_by_position`),
    longer ones run by run (`_sign_runs`), each text's signature from its own shingles either way:
    the work is linear in S, and one 5 MB text costs what the same shingles in many texts of more
    than _POSITIONS shingles cost. Either way every permutation of every shingle is one multiply and
    add; the runs then pay a `minimum.reduceat` call per (text, permutation), ~7 ns, which is most of
    a short text's cost (tweets: ~16 shingles, signed ~1.8x faster by position), and the positions
    a `minimum` per value and a gather per shingle instead, which cost more than that call on texts
    of more than ~100 shingles.
    """
    order = _signing_order(np.diff(offsets))
    sig = np.empty((num_perm, len(order)), dtype=np.uint32)  # column j: text order[j]
    signed = sum(block.shape[1] for _, block in _signature_blocks(hashes, offsets, num_perm, seed, order, sig))
    sig[:, signed:] = 0xFFFFFFFF  # the texts without shingles
    return _unsort_columns(sig, order).T


def band_keys_from_hashes(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int, bands: int,
                          rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`band_keys` of the texts' signatures, without their (N, P) signatures: (bands, N) keys whose
    column j is text order[j]'s, and (N,) order (`_signing_order`). Each block of signatures
    (`_signature_blocks`) gives its texts' keys while it is in cache; the keys stay in that order,
    which `candidates_of_keys` takes as it is: neither the signatures nor the keys are reordered
    (putting the signatures in the texts' order cost ~1/4 of their time on the tweets)."""
    order = _signing_order(np.diff(offsets))
    keys = np.empty((bands, len(order)), dtype=U64)
    signed = 0
    for c, block in _signature_blocks(hashes, offsets, num_perm, seed, order):
        signed = c + block.shape[1]
        keys[:, c:signed] = band_keys(block.T, bands, rows)
    if signed < len(order):  # the texts without shingles: datasketch's empty signature
        keys[:, signed:] = band_keys(np.full((1, num_perm), 0xFFFFFFFF, dtype=np.uint32), bands, rows)
    return keys, order


def _signature_blocks(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int, order: np.ndarray,
                      into: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(c, block) for blocks of the texts with shingles, in `order` (`_signing_order`'s): block
    (P, k) is the signatures of texts order[c:c+k]. The long texts' come as one block; the short
    ones' in blocks of _POSITION_BLOCK // P texts, views of into (P, N) when given (its columns in
    `order`), else of one buffer that the next block reuses."""
    a, b = permutations(num_perm, seed)
    a, b = a[:, None], b[:, None]  # (P, 1)
    h = hash32(hashes)
    _fmix32(h, out=h)
    lengths = np.diff(offsets)
    is_long = lengths > _POSITIONS
    long = int(np.count_nonzero(is_long))  # the first in order
    short = int(np.count_nonzero(lengths)) - long  # then these; the empty ones last
    if long:
        runs = np.zeros(long + 1, dtype=np.int64)
        np.cumsum(lengths[is_long], out=runs[1:])
        block = _sign_runs(h if long == len(lengths) else h[np.repeat(is_long, lengths)], runs, a, b)
        if into is not None:
            into[:, :long] = block
        yield 0, block
    chunk = max(1, _POSITION_BLOCK // num_perm)
    buffer = np.empty((num_perm, min(chunk, short)), dtype=np.uint32) if into is None else None
    tmp = np.empty(num_perm * min(chunk, short), dtype=np.uint32)
    for c in range(long, long + short, chunk):
        docs = order[c : min(c + chunk, long + short)]
        block = into[:, c : c + len(docs)] if into is not None else buffer[:, : len(docs)]
        _sign_by_position(h, offsets[docs], lengths[docs], a, b, block, tmp)
        yield c, block


def _signing_order(lengths: np.ndarray) -> np.ndarray:
    """(N,) the texts in the order their signatures are made: those of more than _POSITIONS
    shingles (by index), then the others by shingles, most first (by index among equals), the
    empty ones last. One stable sort, of uint16 keys (which numpy radix-sorts) unless the limit
    is huge."""
    key = np.maximum(_POSITIONS + 1 - lengths, 0)
    return np.argsort(key.astype(np.uint16) if _POSITIONS < (1 << 16) - 1 else key, kind="stable")


@contextlib.contextmanager
def _ufunc_buffer(size: int):
    """numpy's ufunc buffer size (elements) set for a block of code, and set back. numpy 2.4 runs a
    ufunc over 2-d strided operands whose rows hold at most a quarter of its buffer (8192 by default)
    through the buffer: (128, 2048) uint32 operands cost 2-4x what (128, 2049) ones cost per value,
    and the blocks signed by position shrink to a few texts at their longest positions."""
    old = np.setbufsize(size)
    try:
        yield
    finally:
        np.setbufsize(old)


def _sign_by_position(h: np.ndarray, starts: np.ndarray, lengths: np.ndarray, a: np.ndarray, b: np.ndarray,
                      out: np.ndarray, tmp: np.ndarray) -> None:
    """Write into out (P, T) the minima of T texts (`starts`, `lengths` (T,), longest first, none
    empty) position by position: the texts with an l-th shingle are a prefix, so position l of all
    of them is one (P, texts) multiply, add and `minimum` into their running minima, rows along the
    texts, which numpy vectorizes. tmp: P * T values of scratch."""
    num_perm = len(a)
    with _ufunc_buffer(_UFUNC_BUFFER):
        np.multiply(a, h[starts], out=out)  # position 0: every text has one
        np.add(out, b, out=out)
        counts = np.searchsorted(-lengths, -np.arange(1, int(lengths[0])), side="left")  # texts with more than l
        for l, count in enumerate(counts.tolist(), start=1):
            t = tmp[: num_perm * count].reshape(num_perm, count)
            np.multiply(a, h[starts[:count] + l], out=t)
            np.add(t, b, out=t)
            np.minimum(out[:, :count], t, out=out[:, :count])


def _sign_runs(h: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(P, N) minima of the runs h[offsets[i]:offsets[i+1]] (none empty) of 32-bit hashes, in chunks
    of _SIGNATURE_BLOCK // P shingles whatever texts they belong to: per chunk one (P, chunk)
    multiply and add give every permutation of every shingle, and one `minimum.reduceat` along the
    rows gives each run's minimum over its part of the chunk, folded into its column (a run crossing
    a chunk edge is folded once per chunk)."""
    num_perm = len(a)
    sig = np.full((num_perm, len(offsets) - 1), 0xFFFFFFFF, dtype=np.uint32)
    chunk = max(1, _SIGNATURE_BLOCK // num_perm)
    block = np.empty((num_perm, min(chunk, len(h))), dtype=np.uint32)
    for s in range(0, len(h), chunk):
        e = min(s + chunk, len(h))
        # the runs holding shingle s, up to the last one starting before e
        first, last = int(np.searchsorted(offsets, s, side="right")) - 1, int(np.searchsorted(offsets, e))
        t = block[:, : e - s]
        np.multiply(a, h[None, s:e], out=t)
        np.add(t, b, out=t)
        part = np.minimum.reduceat(t, np.maximum(offsets[first:last], s) - s, axis=1)  # (P, runs)
        np.minimum(sig[:, first:last], part, out=sig[:, first:last])
    return sig


def _unsort_columns(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """(R, N) with column order[j] = values' column j (itself when order is the identity): one
    gather per row (a row of N values stays in cache; ~1.4x faster here than `take` along axis 1)."""
    if np.array_equal(order, np.arange(len(order))):
        return values
    at = np.empty_like(order)
    at[order] = np.arange(len(order))
    out = np.empty_like(values)
    for row, into in zip(values, out):
        np.take(row, at, out=into)
    return out


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, N) uint64 key of each text's bands sig[:, k*rows:(k+1)*rows]: fmix64 of the sum of the
    band's values times fixed odd multipliers (mod 2^64), one multiply-add per value and one mix per
    band. Equal bands give equal keys; unequal ones collide with chance ~2^-64, and two that differ
    in one value never do (an odd multiple of a nonzero 32-bit difference is nonzero mod 2^64)."""
    n = len(sig)
    mult = fmix64(np.arange(1, rows + 1, dtype=U64) * GOLD) | U64(1)
    # (bands, rows, N): a view of a permutation-major sig (signatures_from_hashes'), else a copy
    values = sig.T[: bands * rows].reshape(bands, rows, n)
    keys = np.empty((bands, n), dtype=U64)
    step = max(1, _KEYS_BLOCK // max(1, n))  # bands at a time, so that their sums stay in cache
    term = np.empty((min(step, bands), n), dtype=U64)
    for k in range(0, bands, step):
        key, t = keys[k : k + step], term[: min(step, bands - k)]
        np.multiply(values[k : k + step, 0], mult[0], out=key)
        for j in range(1, rows):
            np.multiply(values[k : k + step, j], mult[j], out=t)
            key += t
        key[:] = fmix64(key)
    return keys
