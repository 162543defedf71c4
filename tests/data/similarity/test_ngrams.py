"""The contamination check's n-gram arithmetic against a plain-Python reading of the same definition: words
are `\\w+` runs of the casefolded text, an n-gram is n consecutive words, a text under n words has none."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from pipeline.data.similarity import ngrams


def _grams(text: str, n: int) -> list[tuple[str, ...]]:
    words = re.findall(r"\w+", text.casefold())
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def _reference_overlaps(texts, n, reference_texts):
    ref = {g for t in reference_texts for g in _grams(t, n)}
    out = []
    for t in texts:
        grams = _grams(t, n)
        found = [i for i, g in enumerate(grams) if g in ref]
        covered = set()
        for i in found:
            covered.update(range(i, i + n))
        out.append((len(found), len(covered), len(re.findall(r"\w+", t.casefold())), found[0] if found else -1))
    return out


@pytest.mark.parametrize("n", [1, 3, 13])
def test_overlaps_equal_the_plain_definition_on_random_texts_with_planted_copies(n):
    rng = random.Random(n)
    vocab = [f"w{k}" for k in range(60)] + ["Über", "naïve", "x_y", "42"]
    reference = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 40))) for _ in range(30)]
    texts = []
    for k in range(200):
        words = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
        if k % 3 == 0 and reference[k % 30]:  # a run of a reference text, in other case and punctuation
            src = reference[k % 30].split()
            a = rng.randrange(len(src))
            words[rng.randint(0, len(words)):0] = [w.upper() + rng.choice(["", ",", "!"]) for w in src[a:a + 16]]
        texts.append(rng.choice(["", "  "]) + " ".join(words) + rng.choice(["", ".", " -- "]))
    got = ngrams.overlaps(texts, n, ngrams.ngram_set(reference, n))
    assert list(zip(*(a.tolist() for a in got))) == _reference_overlaps(texts, n, reference)
    assert sum(1 for f in got[0] if f) > 20  # the planted copies are found, not only the empty cases
    for k in np.flatnonzero(got[0]).tolist()[:10]:  # the first n-gram found reads back as a reference n-gram
        first = ngrams.ngram_text(texts[k], n, int(got[3][k]))
        assert tuple(first.split()) in {g for t in reference for g in _grams(t, n)}


def test_a_text_under_n_words_has_no_ngram_and_pairs_name_the_texts_holding_the_wanted_ones():
    ref = ngrams.ngram_set(["one two three four five"], 3)
    assert len(ref) == 3
    found, covered, words, first = ngrams.overlaps(["one two", "", "zero one two three four", "ONE, two; three!"], 3, ref)
    assert found.tolist() == [0, 0, 2, 1] and covered.tolist() == [0, 0, 4, 3] and words.tolist() == [2, 0, 5, 3]
    assert first.tolist() == [-1, -1, 1, 0]
    wanted = ngrams.found_hashes("two three four", 3, ref)
    texts = ["one two three four five", "two three four", "five six seven"]
    assert [i for _, i in ngrams.pairs(texts, ["a", "b", "c"], 3, wanted)] == ["a", "b"]
    assert ngrams.overlaps([], 3, ref)[0].tolist() == []
