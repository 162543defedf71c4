"""Word n-gram overlap, vectorized: the contamination check's arithmetic (GPT-3's and lm-eval-harness's 13-gram
test; datatrove uses 12).

Words are dedup's (shingling.py): maximal runs of `\\w` characters of the casefolded text, so case, punctuation
and whitespace never hide an overlap. A document of fewer than n words has no n-gram and is never found (as in
lm-eval-harness and corpus-assay); the check counts those as too short. An n-gram hashes to 64 bits by the same
chain as dedup's shingles; at 64 bits a chance collision among a few hundred million n-grams has a probability
around 1e-3, and every reported n-gram is read back from the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pipeline.data.similarity.shingling import GOLD, U64, _code_points, _SpanHasher, _word_spans, fmix64

_WORD = re.compile(r"\w+")


@dataclass
class Grams:
    hashes: np.ndarray  # (G,) uint64, every n-gram of every text, in order
    offsets: np.ndarray  # (N+1,) text i owns hashes[offsets[i]:offsets[i+1]] (none under n words)
    words: np.ndarray  # (N,) words per text


def word_ngrams(texts: list[str], n: int) -> Grams:
    """Every word n-gram of every text, hashed."""
    if not texts:
        return Grams(np.zeros(0, dtype=U64), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    cp, starts = _code_points([t.casefold() for t in texts])
    w_start, w_end = _word_spans(cp, starts)
    w_hash = _SpanHasher(cp)(w_start, w_end)
    w_first = np.searchsorted(w_start, starts)  # (N+1,) each text's first word
    words = np.diff(w_first)
    count = np.maximum(words - n + 1, 0)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    chain = fmix64(w_hash)
    for k in range(2, n + 1):  # (W - k + 1,) chains of k words, from each word
        chain = fmix64(chain[:-1] * GOLD + w_hash[k - 1:])
    first = np.repeat(w_first[:-1] - offsets[:-1], count) + np.arange(offsets[-1])  # each gram's first word
    return Grams(chain[first] if len(first) else np.zeros(0, dtype=U64), offsets, words)


def ngram_set(texts: list[str], n: int) -> np.ndarray:
    """The sorted distinct n-gram hashes of `texts`."""
    return np.unique(word_ngrams(texts, n).hashes)


def _sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(N,) sum of values[offsets[i]:offsets[i+1]] for each i (empty ranges: 0)."""
    total = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    return total[offsets[1:]] - total[offsets[:-1]]


def _member(hashes: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if not len(sorted_set) or not len(hashes):
        return np.zeros(len(hashes), dtype=bool)
    at = np.searchsorted(sorted_set, hashes).clip(max=len(sorted_set) - 1)
    return sorted_set[at] == hashes


def overlaps(texts: list[str], n: int, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per text, against the sorted n-gram hashes `reference`: (n-grams found in it, words those n-grams
    cover, words, index of the first found n-gram or -1), each (N,) int64."""
    g = word_ngrams(texts, n)
    found = _member(g.hashes, reference)
    per_text = _sums(found, g.offsets)
    # words covered: +1 where a found gram starts, -1 n words later, on the word axis of all texts
    word_base = np.concatenate(([0], np.cumsum(g.words)))
    doc = np.repeat(np.arange(len(texts)), np.diff(g.offsets))
    starts = word_base[doc] + (np.arange(len(g.hashes)) - g.offsets[doc])
    delta = np.zeros(int(word_base[-1]) + 1, dtype=np.int64)
    np.add.at(delta, starts[found], 1)
    np.add.at(delta, starts[found] + n, -1)
    covered = np.cumsum(delta[:-1]) > 0
    covered_per_text = _sums(covered, word_base)
    first = np.full(len(texts), -1, dtype=np.int64)
    hit_docs = np.flatnonzero(per_text)
    if len(hit_docs):
        index = np.flatnonzero(found)
        first_found = index[np.searchsorted(index, g.offsets[hit_docs])]
        first[hit_docs] = first_found - g.offsets[hit_docs]
    return per_text, covered_per_text, g.words.astype(np.int64), first


def pairs(texts: list[str], ids: list[str], n: int, wanted: np.ndarray) -> list[tuple[int, str]]:
    """(hash, id) for each text and each of the sorted hashes `wanted` its n-grams hold, once each."""
    g = word_ngrams(texts, n)
    hit = np.flatnonzero(_member(g.hashes, wanted))
    if not len(hit):
        return []
    doc = np.searchsorted(g.offsets, hit, side="right") - 1
    return sorted({(h, ids[d]) for h, d in zip(g.hashes[hit].tolist(), doc.tolist())})


def found_hashes(text: str, n: int, reference: np.ndarray) -> np.ndarray:
    """The sorted distinct n-gram hashes of one text that `reference` holds."""
    h = word_ngrams([text], n).hashes
    return np.unique(h[_member(h, reference)])


def ngram_text(text: str, n: int, k: int) -> str:
    """The k-th word n-gram of `text`, as the check reads it (casefolded words, one space apart)."""
    return " ".join(_WORD.findall(text.casefold())[k:k + n])
