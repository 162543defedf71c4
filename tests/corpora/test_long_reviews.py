import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import SourceConfig
from pipeline.corpora import long_reviews as lr
from pipeline.data.io.readers import read_folder

SLICE = Path(__file__).with_name("long_reviews_slice.jsonl")  # reviews(0, 200, 100), as the module's CLI wrote it


def _slice() -> list[dict]:
    return [json.loads(line) for line in SLICE.read_text(encoding="utf-8").splitlines()]


def test_slice_is_the_start_of_the_generated_corpus(tmp_path):
    """Deterministic from the seed: regenerating gives the committed bytes (if the clean stage changes
    what it does to tweets, rerun `python -m pipeline.corpora.long_reviews --format jsonl --out
    tests/corpora/long_reviews_slice.jsonl --train 200 --test 100`)."""
    assert SLICE.stat().st_size < 1_000_000
    lr.write_jsonl(tmp_path / "again.jsonl", lr.reviews(0, 200, 100))
    assert (tmp_path / "again.jsonl").read_bytes() == SLICE.read_bytes()
    # review k does not depend on the corpus size: the 25k corpus starts with this slice
    assert lr.review(0, "test", 7) == list(lr.reviews(0, 0, 50))[7]
    assert lr.review(1, "test", 7).text != lr.review(0, "test", 7).text


def test_slice_has_imdb_like_lengths_and_balanced_labels():
    rows = _slice()
    words = np.array([len(r["text"].split()) for r in rows])
    assert 190 <= words.mean() <= 270 and 450 <= np.percentile(words, 95) <= 750 and words.min() >= lr.MIN_WORDS
    for split, n in (("train", 200), ("test", 100)):
        labels = [r["label"] for r in rows if r["split"] == split]
        assert len(labels) == n and labels.count("pos") == labels.count("neg") == n // 2


def test_label_rests_on_scattered_cues_at_the_rates_stated():
    rows = _slice()
    opening = np.mean([any(p == "opening" for p, _ in r["cues"]) for r in rows])
    closing = np.mean([any(p == "closing" for p, _ in r["cues"]) for r in rows])
    assert abs(opening - lr.P_OPENING) < 0.08 and abs(closing - lr.P_CLOSING) < 0.08
    middle = [q == r["label"] for r in rows for p, q in r["cues"] if p == "middle"]
    assert 0.7 <= np.mean(middle) <= 0.9  # 0.75 drawn, plus the ones forced to agree
    assert all(any(q == r["label"] for _, q in r["cues"]) for r in rows)  # every review says its label somewhere
    assert all({q for p, q in r["cues"] if p != "middle"} <= {r["label"]} for r in rows)  # verdicts never lie


def test_verdicts_open_and_close_the_text_and_come_from_the_split_s_half():
    pools = lr.sentence_pools()
    assert not set(pools[("train", "pos")]) & set(pools[("test", "pos")])
    for r in _slice():
        own = pools[(r["split"], r["label"])]
        if ["opening", r["label"]] in r["cues"]:
            assert any(r["text"].startswith(s) for s in own), r["id"]
        if ["closing", r["label"]] in r["cues"]:
            assert any(r["text"].endswith(s) for s in own), r["id"]


def test_folder_layout_reads_as_the_imdb_release(tmp_path):
    items = list(lr.reviews(0, 4, 2))
    assert lr.write_folders(tmp_path / "corpus", items) == 6
    table, _ = read_folder(tmp_path / "corpus", SourceConfig(format="folder", path=str(tmp_path / "corpus")))
    got = sorted(zip(*(table[c].to_pylist() for c in ("id", "label", "source_split", "text"))))
    assert got == sorted((r.id, r.label, r.split, r.text) for r in items)


def test_cli_refuses_a_non_empty_folder(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("x")
    assert lr.main(["--out", str(tmp_path), "--train", "2", "--test", "2"]) == 2
    assert f"error: {tmp_path} is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lr.main(["--out", str(tmp_path / "new"), "--train", "-1"])
