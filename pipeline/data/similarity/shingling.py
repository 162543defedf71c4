"""Shingles and their hashes, vectorized: every shingle of a batch of texts hashed once, in numpy.

Words are maximal runs of `str.isalnum()` characters and `_` in the casefolded text (what `\\w+`
matches); a text with fewer than n words gives one shingle of all its words, and a text without
any word character one shingle of its whole normalized text. Output: `hashes` (S,) uint64 and
`offsets` (N+1,) so that text d owns hashes[offsets[d]:offsets[d+1]].
"""

from __future__ import annotations

import functools
import re

import numpy as np

U64 = np.uint64
_K = 0x100000001B3  # odd multiplier of the polynomial code-point hash (invertible mod 2^64)
_K_INV = pow(_K, -1, 1 << 64)
GOLD = U64(0x9E3779B97F4A7C15)  # chains word hashes into an n-gram hash
_BATCH_CHARS = 1 << 18  # code points hashed per batch: its ~10 arrays of 8 bytes each stay in cache
# (2^18 to 2^21 cost the same within ~15% on a loaded machine; 2^15 ~1.4x: bench/results/dedup.md)
_WORD = re.compile(r"\w+")
# every character str.split() splits on but " " (tested against all code points)
_OTHER_SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


def normalize_text(text: str, folded: bool = False) -> str:
    """Casefolded, whitespace collapsed (`" ".join(text.casefold().split())`): the key of exact
    duplicates and of char shingles. Done as every whitespace character -> " ", runs of " " -> one,
    ends stripped: a few scans and copies in C instead of a list of words (most of the cost on
    long texts). " " is the one printable whitespace character (a test checks all code points),
    so a printable text has no other. folded: `text` is casefolded already, which casefolding
    again would not change (a test checks all code points), so it is not."""
    folded = text if folded else text.casefold()
    if not folded.isprintable():
        for space in _OTHER_SPACES:
            if space in folded:
                folded = folded.replace(space, " ")
    while "  " in folded:
        folded = folded.replace("  ", " ")
    return folded.strip(" ")


@functools.cache
def _bmp_spaces() -> np.ndarray:
    """(65536,) bool: the characters `normalize_text` turns into a space (all in the BMP)."""
    table = np.zeros(65536, dtype=bool)
    table[[ord(c) for c in " " + _OTHER_SPACES]] = True
    return table


def normalized_lengths(texts: list[str], folded: bool = False) -> np.ndarray:
    """(N,) `len(normalize_text(t, folded))` of each text, without making the normalized texts: a
    normalized text is its words (runs of non-space characters) joined by one space, so its length
    is its non-space characters plus its words less one. In numpy over the code points of all the
    texts at once (~1/10 of the cost of normalizing them one by one)."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    cp, starts = _spaced_code_points(texts if folded else list(map(str.casefold, texts)))
    solid = ~_bmp_spaces().take(cp, mode="clip")  # U+FFFF, where higher ones clip to, is no space
    word_start = np.zeros(len(cp), dtype=bool)
    word_start[1:] = solid[1:] & ~solid[:-1]
    bounds = starts[:-1] - 1  # each text's leading space: no text's span is empty
    words = np.add.reduceat(word_start, bounds, dtype=np.int64)
    return np.add.reduceat(solid, bounds, dtype=np.int64) + np.maximum(words - 1, 0)


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


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit (wraps mod 2^64).
    A new array; after its first step it works in place (two arrays allocated, not seven)."""
    shifted = h >> U64(33)
    h = h ^ shifted
    h *= U64(0xFF51AFD7ED558CCD)
    np.right_shift(h, U64(33), out=shifted)
    h ^= shifted
    h *= U64(0xC4CEB9FE1A85EC53)
    np.right_shift(h, U64(33), out=shifted)
    h ^= shifted
    return h


@functools.cache
def _bmp_word_chars() -> np.ndarray:
    """(65536,) bool: which Basic-Multilingual-Plane code points `\\w` matches, by one `re.sub`
    over all of them (in C) that turns word characters into code point 1 (itself no word char)."""
    marked = re.sub(r"\w", "\x01", "".join(map(chr, range(65536))))
    table = np.frombuffer(marked.encode("utf-32-le", "surrogatepass"), dtype=np.uint32) == 1
    table[1] = False
    return table


def _is_word_char(cp: np.ndarray) -> np.ndarray:
    out = _bmp_word_chars().take(cp, mode="clip")  # U+FFFF, where higher ones clip to, is no word char
    high = cp > 65535  # emoji, rare scripts: look up only the distinct ones
    if high.any():
        uniq, inv = np.unique(cp[high], return_inverse=True)
        out[high] = np.array([bool(_WORD.match(chr(c))) for c in uniq.tolist()], dtype=bool)[inv]
    return out


def _power_table(size: int) -> tuple[np.ndarray, np.ndarray]:
    """K^j and K^-j mod 2^64 for j < size."""
    powers = np.full(size, _K, dtype=U64)
    inverse = np.full(size, _K_INV, dtype=U64)
    powers[0] = inverse[0] = 1
    return np.cumprod(powers), np.cumprod(inverse)


_power_tables: list[tuple[np.ndarray, np.ndarray]] = []  # the last two made, most recent first


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """K^j and K^-j mod 2^64 for j < n (at least): one of the last two tables made (a power of two
    entries each) when it is long enough, else a new one. The batches' sizes vary (~2^18 code
    points, more or fewer by a text's length; the last one shorter), so tables cached by their
    exact size were made again in turn: ~4 ms of the tweets' ~35."""
    for table in _power_tables:
        if len(table[0]) >= n:
            return table
    table = _power_table(1 << max(n - 1, 1).bit_length())
    _power_tables[:] = [table, *_power_tables[:1]]
    return table


class _SpanHasher:
    """Hash any span [s, e) of a code-point array in O(1) after one prefix sum.

    hash(s, e) = fmix64(sum_{j<e-s} cp[s+j] * K^j + len * GOLD): prefix sums of cp[j] * K^j, shifted
    to position 0 by K^-s (K odd, so invertible mod 2^64); all arithmetic wraps mod 2^64.
    """

    def __init__(self, cp: np.ndarray):
        n = len(cp)
        powers, self.inv = _powers(n + 1)
        self.prefix = np.zeros(n + 1, dtype=U64)  # (C+1,) sum_{j<i} cp[j] * K^j
        np.multiply(cp, powers[:n], out=self.prefix[1:])
        np.cumsum(self.prefix[1:], out=self.prefix[1:])

    def __call__(self, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        raw = (self.prefix[e] - self.prefix[s]) * self.inv[s]
        return fmix64(raw + (e - s).astype(U64) * GOLD)


def _code_points(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All texts' code points in one (C,) uint32 array, and each text's start (N+1,)."""
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=starts[1:])
    cp = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # lone surrogates too
    return cp, starts


def _spaced_code_points(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """_code_points of the texts with a space (no word character) before each and after the last,
    so that no word crosses a text's edge and each word starts and ends at a change of
    `_is_word_char`: (C,) uint32, and each text's start (N+1,) (the last: C)."""
    starts = np.ones(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) + 1, out=starts[1:])
    starts[1:] += 1
    spaced = " ".join(texts).join("  ")  # " " + the texts joined by " " + " "
    return np.frombuffer(spaced.encode("utf-32-le", "surrogatepass"), dtype=np.uint32), starts


def text_hashes(texts: list[str]) -> np.ndarray:
    """(N,) uint64 hash of each whole text: equal texts, equal hashes."""
    cp, starts = _code_points(texts)
    return _SpanHasher(cp)(starts[:-1], starts[1:])


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each start s and length l, without a Python loop: the
    running sum of steps of 1, each range's first step a jump from the previous range's last value
    (one pass over the output, ~2x faster than a repeat of the starts plus an arange)."""
    ends = np.cumsum(lengths)
    out = np.ones(int(ends[-1]) if len(ends) else 0, dtype=np.result_type(starts, lengths, np.int64))
    some = lengths > 0
    jump = starts[some] - np.concatenate(([0], (starts + lengths)[some][:-1] - 1))  # from the value before
    out[(ends - lengths)[some]] = jump
    return np.cumsum(out, out=out)


def _word_spans(cp: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W,) start and (W,) end of every word in the code points, no word crossing a text's start."""
    word = _is_word_char(cp)
    prev = np.concatenate(([False], word[:-1]))
    nxt = np.concatenate((word[1:], [False]))
    prev[starts[:-1][starts[:-1] < len(cp)]] = False  # a word never continues across texts
    nxt[starts[1:][starts[1:] > 0] - 1] = False
    return np.flatnonzero(word & ~prev), np.flatnonzero(word & ~nxt) + 1


def _word_ngrams(texts: list[str], n: int, normalized: bool) -> tuple[np.ndarray, np.ndarray]:
    """An n-gram's hash chains its words' hashes: h = fmix64(h * GOLD + word), from h = 0. Chains of
    k words are built from every word at once, k = 1..n (array shifts, no gather per shingle); a
    text of fewer than n words takes its one chain of all its words."""
    folded = texts if normalized else list(map(str.casefold, texts))
    cp, starts = _spaced_code_points(folded)
    word = _is_word_char(cp)
    edges = np.flatnonzero(word[1:] != word[:-1]) + 1  # a word's start, then its end, ...
    w_start, w_end = edges[0::2], edges[1::2]
    w_hash = _SpanHasher(cp)(w_start, w_end)  # (W,) one hash per word
    w_first = np.searchsorted(w_start, starts)  # (N+1,) index of each text's first word
    n_words = np.diff(w_first)
    count = np.maximum(n_words - n + 1, 1)  # shingles per text
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    short = np.flatnonzero((n_words < n) & (n_words > 0))
    fills, chain = [], fmix64(w_hash)  # (W - k + 1,) chains of k words, from each word
    for k in range(1, n + 1):
        if k > 1:
            chain = fmix64(chain[:-1] * GOLD + w_hash[k - 1 :])
        at = short[n_words[short] == k]
        fills.append((offsets[at], chain[w_first[at]]))
    first = _ranges(w_first[:-1], count)  # (S,) first word of each shingle
    h = chain.take(first, mode="clip") if len(chain) else np.zeros(len(first), dtype=U64)
    for at, value in fills:
        h[at] = value
    empty = np.flatnonzero(n_words == 0)  # no word character: the whole normalized text
    if len(empty):
        h[offsets[empty]] = text_hashes([normalize_text(texts[i]) for i in empty])
    return h, offsets


def _char_ngrams(texts: list[str], n: int, normalized: bool) -> tuple[np.ndarray, np.ndarray]:
    # normalized per text in C: cheaper than a numpy whitespace pass
    cp, starts = _code_points(texts if normalized else [normalize_text(t) for t in texts])
    lengths = np.diff(starts)
    count = np.maximum(lengths - n + 1, 1)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    doc = np.repeat(np.arange(len(texts)), count)
    s = starts[:-1][doc] + np.arange(offsets[-1]) - offsets[:-1][doc]
    return _SpanHasher(cp)(s, np.minimum(s + n, starts[1:][doc])), offsets


def shingle_hashes(texts: list[str], unit: str, n: int, normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every shingle (S,) uint64 and per-text offsets (N+1,): text i owns
    hashes[offsets[i]:offsets[i+1]] (at least one). Equal shingles (see `shingles`) hash equally.
    normalized: the texts are `normalize_text`'s output, whose shingles are the raw texts' (case
    folding is idempotent and whitespace is never part of a word), so folding again is skipped;
    for word shingles casefolded texts are enough (their words are the normalized texts')."""
    if not texts:
        return np.zeros(0, dtype=U64), np.zeros(1, dtype=np.int64)
    fn = _char_ngrams if unit == "char" else _word_ngrams
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    batch = (ends - 1) // _BATCH_CHARS  # texts that start in one window of code points hash together
    bounds = [0, *(np.flatnonzero(np.diff(batch)) + 1).tolist(), len(texts)]
    parts, offsets = [], [np.zeros(1, dtype=np.int64)]
    for s, e in zip(bounds[:-1], bounds[1:]):
        h, off = fn(texts[s:e], n, normalized)
        parts.append(h)
        offsets.append(off[1:] + offsets[-1][-1])
    return np.concatenate(parts), np.concatenate(offsets)
