import json
from collections import Counter

import pytest
from datasets import Dataset

from pipeline.config import DedupConfig, SplitConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.stages.split import assign, chunk_text, split


def _docs(n, labels=("a", "b"), source_split=""):
    return {
        "id": [f"doc{k}" for k in range(n)],
        "text": [f"document number {k} talks about topic {k % 7} in its own words {k * 31}" for k in range(n)],
        "label": [labels[k % len(labels)] for k in range(n)],
        "source_split": [source_split] * n,
    }


def test_ratios_and_stratification():
    ids = [f"d{k}" for k in range(3000)]
    labels = ["x" if k % 3 else "y" for k in range(3000)]
    out = assign(ids, labels, (0.8, 0.1, 0.1), seed=1, stratify=True)
    per = Counter(zip(labels, out))
    assert per[("y", "train")] == 800 and per[("y", "validation")] == 100 and per[("y", "test")] == 100
    assert per[("x", "train")] == 1600 and per[("x", "test")] == 200


def test_adding_documents_does_not_move_others():
    ids = [f"d{k}" for k in range(2000)]
    labels = ["x"] * 2000
    before = dict(zip(ids, assign(ids, labels, (0.8, 0.1, 0.1), seed=3, stratify=False)))
    more = ids + [f"new{k}" for k in range(500)]
    after = dict(zip(more, assign(more, labels + ["x"] * 500, (0.8, 0.1, 0.1), seed=3, stratify=False)))
    assert all(after[i] == before[i] for i in ids)  # exactly stable without stratification
    after_s = dict(zip(more, assign(more, labels + ["x"] * 500, (0.8, 0.1, 0.1), seed=3, stratify=True)))
    before_s = dict(zip(ids, assign(ids, labels, (0.8, 0.1, 0.1), seed=3, stratify=True)))
    moved = sum(after_s[i] != before_s[i] for i in ids)
    assert moved <= 0.02 * len(ids)  # only documents at the quantile boundaries move


def test_seed_changes_assignment():
    ids = [f"d{k}" for k in range(500)]
    a = assign(ids, ["x"] * 500, (0.5, 0.25, 0.25), seed=1, stratify=False)
    b = assign(ids, ["x"] * 500, (0.5, 0.25, 0.25), seed=2, stratify=False)
    assert a != b


def test_chunks_of_a_document_stay_together(tmp_path):
    data = _docs(200)
    data["text"][0] = " ".join(f"w{k}" for k in range(700))
    data["text"][1] = "First sentence here. " * 60
    cfg = SplitConfig(chunk="words", chunk_size=100, chunk_overlap=20, leakage="off")
    dd = split(Dataset.from_dict(data), cfg, StageContext(tmp_path, similarity=DedupConfig())).data
    where = {}
    for s in dd:
        for doc, k in zip(dd[s]["id"], dd[s]["chunk"]):
            where.setdefault(doc, set()).add(s)
    assert all(len(v) == 1 for v in where.values())
    doc0 = [s for s in dd if "doc0" in dd[s]["id"]][0]
    assert sorted(c for d, c in zip(dd[doc0]["id"], dd[doc0]["chunk"]) if d == "doc0") == list(range(9))


def test_chunk_text_windows_and_sentences():
    cfg = SplitConfig(chunk="words", chunk_size=4, chunk_overlap=1)
    assert chunk_text("a b c d e f g", cfg) == ["a b c d", "d e f g"]
    assert chunk_text("a b", cfg) == ["a b"]
    cfg = SplitConfig(chunk="sentence", chunk_size=5)
    assert chunk_text("One two three. Four five six. Seven.", cfg) == ["One two three.", "Four five six. Seven."]


def test_source_split_kept_and_validation_carved(tmp_path):
    train, test = _docs(300, source_split="train"), _docs(100, source_split="test")
    test["id"] = [f"t{k}" for k in range(100)]
    data = {k: train[k] + test[k] for k in train}
    dd = split(Dataset.from_dict(data), SplitConfig(leakage="off"), StageContext(tmp_path, similarity=DedupConfig())).data
    assert set(dd["test"]["id"]) == set(test["id"])
    assert 10 < dd["validation"].num_rows < 60 and dd["train"].num_rows + dd["validation"].num_rows == 300


def test_unknown_source_split_is_an_error(tmp_path):
    data = _docs(10, source_split="holdout")
    with pytest.raises(ValueError, match=r"source split names \['holdout'\]"):
        split(Dataset.from_dict(data), SplitConfig(), StageContext(tmp_path, similarity=DedupConfig()))


def test_leakage_from_source_split_is_removed(tmp_path):
    train = _docs(200, source_split="train")
    test = {"id": ["leak1", "leak2", "clean1"], "label": ["a", "b", "a"], "source_split": ["test"] * 3,
            "text": [train["text"][5], train["text"][9] + " indeed", "a completely different sentence about nothing at all"]}
    data = {k: train[k] + test[k] for k in train}
    dd = split(Dataset.from_dict(data), SplitConfig(), StageContext(tmp_path, similarity=DedupConfig())).data
    assert dd["test"]["id"] == ["clean1"]
    leaks = [json.loads(line) for line in (tmp_path / "leakage.jsonl").read_text().splitlines()]
    assert {(r["id"], r["train_id"]) for r in leaks} == {("leak1", "doc5"), ("leak2", "doc9")}


def _benchmark_source():
    """A source with its own train/validation/test split (texts of 12 words, 10 word 3-grams): test
    t0 a copy of train doc5, t1 a near copy of doc9 (J = 10/11), validation v0 a near copy of test
    t3 (J = 10/11), validation v1 a copy of train doc20."""
    train = _docs(200, source_split="train")
    unique = [" ".join(f"u{k}w{j}" for j in range(12)) for k in range(12)]
    test = {"id": ["t0", "t1", "t2", "t3"], "label": ["a", "b", "a", "b"], "source_split": ["test"] * 4,
            "text": [train["text"][5], train["text"][9] + " indeed", unique[0], unique[1]]}
    val = {"id": [f"v{k}" for k in range(10)], "label": ["a", "b"] * 5, "source_split": ["validation"] * 10,
           "text": [unique[1] + " again", train["text"][20], *unique[2:10]]}
    return Dataset.from_dict({k: train[k] + val[k] + test[k] for k in train})


def test_keep_test_whole_removes_the_train_and_validation_side_of_a_leak(tmp_path):
    ctx = StageContext(tmp_path, similarity=DedupConfig(keep_test_whole=True))
    result = split(_benchmark_source(), SplitConfig(), ctx)
    dd = result.data
    assert dd["test"]["id"] == ["t0", "t1", "t2", "t3"]
    assert dd["validation"]["id"] == [f"v{k}" for k in range(2, 10)]
    assert dd["train"]["id"] == [f"doc{k}" for k in range(200) if k not in (5, 9)]  # doc20 stays: v1 went
    leaks = [json.loads(line) for line in (tmp_path / "leakage.jsonl").read_text().splitlines()]
    assert leaks == [
        {"split": "train", "id": "doc5", "test_id": "t0", "jaccard": 1.0, "removed": "train"},
        {"split": "train", "id": "doc9", "test_id": "t1", "jaccard": round(10 / 11, 4), "removed": "train"},
        {"split": "validation", "id": "v0", "test_id": "t3", "jaccard": round(10 / 11, 4), "removed": "validation"},
        {"split": "validation", "id": "v1", "train_id": "doc20", "jaccard": 1.0, "removed": "validation"},
    ]
    assert result.dropped == {"leak_train": 2, "leak_validation": 2}
    assert result.stats["leaks_found"] == {"train": 2, "validation": 2}


def test_without_keep_test_whole_the_test_side_of_a_leak_is_removed(tmp_path):
    result = split(_benchmark_source(), SplitConfig(), StageContext(tmp_path, similarity=DedupConfig()))
    assert result.data["test"]["id"] == ["t2", "t3"] and "v0" in result.data["validation"]["id"]
    leaks = [json.loads(line) for line in (tmp_path / "leakage.jsonl").read_text().splitlines()]
    assert [(r["split"], r["id"], r["train_id"], r["removed"]) for r in leaks] == [
        ("validation", "v1", "doc20", "validation"), ("test", "t0", "doc5", "test"), ("test", "t1", "doc9", "test")]
    assert result.dropped == {"leak_validation": 1, "leak_test": 2}


def test_keep_test_whole_with_leakage_report_removes_nothing(tmp_path):
    ctx = StageContext(tmp_path, similarity=DedupConfig(keep_test_whole=True))
    result = split(_benchmark_source(), SplitConfig(leakage="report"), ctx)
    assert [result.data[s].num_rows for s in ("train", "validation", "test")] == [200, 10, 4]
    leaks = [json.loads(line) for line in (tmp_path / "leakage.jsonl").read_text().splitlines()]
    assert len(leaks) == 4 and {r["removed"] for r in leaks} == {None} and result.dropped == {}
