"""Known answers for the dedup stage (pipeline/data/dedup.py): planted clusters, the kept row, report."""

from __future__ import annotations

import json

import numpy as np
from datasets import Dataset

from pipeline.config import DedupConfig
from pipeline.data import minhash
from pipeline.data.common import StageContext
from pipeline.data.dedup import REPORT, dedup


def unrelated(n: int, words: int = 30, seed: int = 0) -> list[str]:
    """Texts of random pseudo-words: no two share a word 3-gram by more than chance."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}q{rng.integers(1000)}" for i in range(3000)]
    return [" ".join(rng.choice(vocab, words)) for _ in range(n)]


def edit(text: str, positions: list[int], tag: str) -> str:
    words = text.split()
    for k, p in enumerate(positions):
        words[p] = f"{tag}{k}"
    return " ".join(words)


def dataset(texts: list[str], ids: list[str] | None = None) -> Dataset:
    ids = ids or [f"doc{k:03d}" for k in range(len(texts))]
    return Dataset.from_dict({"id": ids, "text": texts, "label": ["x"] * len(texts), "source_split": [""] * len(texts)})


def planted() -> tuple[list[str], dict[str, set[str]]]:
    """60 unrelated texts and 3 planted clusters; returns texts and {kept id: removed ids}."""
    texts = unrelated(60)
    a, b, c = texts[0], texts[1], texts[2]
    texts += [
        edit(a, [4], "one"),  # doc060: 1 of 30 words edited, J = 25/31 = 0.81 with doc000
        edit(a, [20], "two"),  # doc061
        "  " + a.upper() + " ",  # doc062: exact duplicate after casefold + whitespace collapse
        edit(b, [10], "three") + " extra",  # doc063: longer than doc001, so it is the kept one
        c,  # doc064: a plain copy of doc002, same length: the smaller id (doc002) is kept
    ]
    clusters = {"doc000": {"doc060", "doc061", "doc062"}, "doc063": {"doc001"}, "doc002": {"doc064"}}
    return texts, clusters


def read_report(path) -> dict[str, dict]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {line["kept"]: line for line in lines}


def test_planted_near_duplicates_found_exact_removed_unrelated_kept(tmp_path):
    texts, clusters = planted()
    result = dedup(dataset(texts), DedupConfig(method="minhash", threshold=0.7), StageContext(out_dir=tmp_path))
    removed = set().union(*clusters.values())
    assert set(result.data["id"]) == {f"doc{k:03d}" for k in range(len(texts))} - removed
    assert result.dropped == {"exact_duplicate": 2, "near_duplicate": 3}  # doc062, doc064; doc060/061/001
    assert result.stats["clusters"] == 3 and result.stats["verified_pairs"] >= 3
    assert result.stats["lsh_bands"] * result.stats["lsh_rows"] <= 128
    report = read_report(tmp_path / REPORT)
    assert {k: {r["id"] for r in v["removed"]} for k, v in report.items()} == clusters
    sims = {r["id"]: (r["kind"], r["similarity"]) for v in report.values() for r in v["removed"]}
    assert sims["doc062"] == ("exact", 1.0) and sims["doc064"] == ("exact", 1.0)
    assert sims["doc060"] == ("near", round(25 / 31, 4)) and sims["doc060"][1] >= 0.7
    assert report["doc000"]["size"] == 4 and report["doc000"]["text"] == texts[0][:200]
    assert list(result.data.column_names) == ["id", "text", "label", "source_split"]


def test_kept_row_does_not_depend_on_row_order(tmp_path):
    texts, _ = planted()
    ids = [f"doc{k:03d}" for k in range(len(texts))]
    cfg = DedupConfig(method="minhash", threshold=0.7)
    first = dedup(dataset(texts, ids), cfg, StageContext(out_dir=tmp_path))
    order = np.random.default_rng(5).permutation(len(texts)).tolist()
    (tmp_path / "shuffled").mkdir()
    shuffled = dataset([texts[i] for i in order], [ids[i] for i in order])
    second = dedup(shuffled, cfg, StageContext(out_dir=tmp_path / "shuffled"))
    assert sorted(first.data["id"]) == sorted(second.data["id"])
    assert (tmp_path / REPORT).read_text() == (tmp_path / "shuffled" / REPORT).read_text()


def test_exact_method_removes_only_exact_duplicates(tmp_path):
    texts, _ = planted()
    result = dedup(dataset(texts), DedupConfig(method="exact"), StageContext(out_dir=tmp_path))
    assert result.dropped == {"exact_duplicate": 2, "near_duplicate": 0}
    assert {"doc062", "doc064"}.isdisjoint(result.data["id"]) and {"doc060", "doc063"} <= set(result.data["id"])
    assert set(read_report(tmp_path / REPORT)) == {"doc000", "doc002"}


def test_none_keeps_everything(tmp_path):
    texts, _ = planted()
    ds = dataset(texts)
    result = dedup(ds, DedupConfig(method="none"), StageContext(out_dir=tmp_path))
    assert result.data is ds and result.dropped == {}


def test_longest_then_smallest_id_is_kept(tmp_path):
    texts = ["Same words  here ", "same words HERE", "same words here", "other text entirely different"]
    ids = ["b", "c", "a", "d"]
    result = dedup(dataset(texts, ids), DedupConfig(method="exact"), StageContext(out_dir=tmp_path))
    assert result.data["id"] == ["a", "d"]  # equal normalized length: the smallest id, not the most spaces


def test_estimate_check_and_char_shingles(tmp_path):
    texts, clusters = planted()
    cfg = DedupConfig(method="minhash", shingle="char", ngram=5, threshold=0.7, verify=False)
    result = dedup(dataset(texts), cfg, StageContext(out_dir=tmp_path))
    assert result.stats["check"] == "minhash_estimate"
    assert set(read_report(tmp_path / REPORT)) == set(clusters)


def test_two_processes_give_the_same_output(tmp_path):
    texts = unrelated(2 * minhash._MIN_DOCS_PER_PROC + 20, seed=2)
    texts += [edit(t, [6], "e") for t in texts[:30]] + texts[30:40]
    outs = []
    for procs in (1, 2):
        (tmp_path / str(procs)).mkdir()
        cfg = DedupConfig(method="minhash", threshold=0.7, num_perm=64, num_proc=procs)
        result = dedup(dataset(texts), cfg, StageContext(out_dir=tmp_path / str(procs)))
        assert result.stats["signature_processes"] == procs
        outs.append((result.data["id"], result.dropped, (tmp_path / str(procs) / REPORT).read_text()))
    assert outs[0] == outs[1] and outs[0][1] == {"exact_duplicate": 10, "near_duplicate": 30}
