"""Known answers for the dedup stage (pipeline/data/stages/dedup.py): planted clusters, the kept row, report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset

from pipeline.config import DedupConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.similarity import minhash
from pipeline.data.stages.dedup import REPORT, dedup


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


def test_no_duplicates_keeps_everything_and_writes_an_empty_report(tmp_path):
    for method in ("exact", "minhash"):
        result = dedup(dataset(unrelated(30)), DedupConfig(method=method), StageContext(out_dir=tmp_path))
        assert len(result.data) == 30 and result.dropped == {"exact_duplicate": 0, "near_duplicate": 0}
        assert (tmp_path / REPORT).read_text() == "" and result.stats["clusters"] == 0


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


@pytest.mark.slow
def test_two_processes_give_the_same_output(tmp_path):
    texts = unrelated(2 * minhash._MIN_DOCS_PER_PROC + 20, seed=2)
    texts += [edit(t, [6], "e") for t in texts[:30]] + texts[30:40]
    outs = []
    for procs in (1, 2):
        (tmp_path / str(procs)).mkdir()
        cfg = DedupConfig(method="minhash", threshold=0.7, num_perm=64)
        result = dedup(dataset(texts), cfg, StageContext(out_dir=tmp_path / str(procs), num_proc=procs))
        assert result.stats["signature_processes"] == procs
        outs.append((result.data["id"], result.dropped, (tmp_path / str(procs) / REPORT).read_text()))
    assert outs[0] == outs[1] and outs[0][1] == {"exact_duplicate": 10, "near_duplicate": 30}


# ---------------------------------------------------------------- a slow reference of the whole plan


def reference_plan(texts: list[str], ids: list[str], cfg: DedupConfig,
                   test: set | None = None) -> tuple[list[int], list[str]]:
    """The dedup decision written plainly (Python sets, dicts, one loop per pair and per member):
    kept rows and the report's lines, for the vectorized stage to match byte for byte. Only the
    LSH candidates come from minhash.py (their equality with MinHashLSH is tested there). `test`:
    rows protected by dedup.keep_test_whole (ranked first, never removed)."""
    norm = [minhash.normalize_text(t) for t in texts]
    rank = lambda i: ((i not in test,) if test is not None else ()) + (-len(norm[i]), ids[i], texts[i], i)  # noqa: E731
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(norm):
        groups.setdefault(t, []).append(i)
    copies = {min(rows, key=rank): sorted(rows, key=rank)[1:] for rows in groups.values()}
    reps = sorted(copies)
    sk, _ = minhash.sketch([texts[i] for i in reps], cfg)
    sets = [set(sk.hashes[sk.offsets[p] : sk.offsets[p + 1]].tolist()) for p in range(len(reps))]
    jac = lambda p, q: len(sets[p] & sets[q]) / len(sets[p] | sets[q])  # noqa: E731
    parent = list(range(len(reps)))
    root = lambda p: p if parent[p] == p else root(parent[p])  # noqa: E731
    if cfg.method == "minhash":
        b, r = minhash.lsh_params(cfg.threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
        for p, q in minhash.band_candidates(sk.sig, b, r).tolist():
            est = float(np.mean(sk.sig[p] == sk.sig[q]))
            if (jac(p, q) if cfg.verify else est) >= cfg.threshold - 1e-12:
                parent[max(root(p), root(q))] = min(root(p), root(q))
    members: dict[int, list[int]] = {}
    for p in range(len(reps)):
        members.setdefault(root(p), []).append(p)
    removed: dict[int, list] = {}
    for group in members.values():
        best = min(group, key=lambda p: rank(reps[p]))
        rows = [(c, "exact", 1.0) for c in copies[reps[best]]]
        for p in group:
            if p != best:
                rows += [(c, "near", round(jac(p, best), 4)) for c in [reps[p], *copies[reps[p]]]]
        if rows:
            removed[reps[best]] = sorted(rows, key=lambda row: (-row[2], rank(row[0])))
    lines = []
    for k in sorted(removed, key=lambda k: (ids[k], k)):
        out = [{"id": ids[c], "kind": kind, "similarity": s, "text": texts[c][:200]} for c, kind, s in removed[k]]
        line = {"kept": ids[k], "size": 1 + len(out), "text": texts[k][:200],
                "removed": [o for o, (c, _, _) in zip(out, removed[k]) if c not in (test or ())]}
        if test is not None:
            line["kept_within_test"] = [o for o, (c, _, _) in zip(out, removed[k]) if c in test]
        lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    gone = {c for rows in removed.values() for c, _, _ in rows} - (test or set())
    return [i for i in range(len(texts)) if i not in gone], lines


def tangled() -> tuple[list[str], list[str]]:
    """Planted clusters that exercise every rule of the kept row and the report: chains
    (A~B~C with A and C apart), ties in length broken by id, exact copies of kept and of removed
    rows (in other case and spacing), a large cluster, similarities that round alike; ids shuffled
    so that row order, id order and rank all differ."""
    rng = np.random.default_rng(11)
    texts = unrelated(400, words=24, seed=3)
    chain = [texts[0]]
    for k in range(6):  # each link edits 3 more words: neighbours J ~ 0.6, the ends far apart
        chain.append(edit(chain[-1], [3 * k + 1, 3 * k + 2, 3 * k + 3], f"c{k}"))
    texts += chain[1:]
    texts += [edit(texts[1], [p], f"t{p}") for p in (5, 9, 13, 17)]  # same length: ties by id
    texts += [texts[1].upper(), "  " + texts[402], texts[405] + "  ", texts[2] + " tail words"]
    texts += [edit(texts[3], list(rng.choice(24, 2, replace=False)), f"big{k}") for k in range(40)]
    texts += [texts[4], edit(texts[4], [0], "x"), edit(texts[4], [23], "y") + " more"]
    for k in range(60):  # noise: near copies of random unrelated texts
        texts.append(edit(texts[20 + k], list(rng.choice(24, 1 + k % 6, replace=False)), f"n{k}"))
    ids = [f"id{v:04d}" for v in rng.permutation(len(texts)).tolist()]
    return texts, ids


@pytest.mark.parametrize(
    "cfg",
    [
        DedupConfig(method="minhash", threshold=0.5),
        DedupConfig(method="minhash", threshold=0.8),
        DedupConfig(method="minhash", threshold=0.6, num_perm=64, bands=8, rows=4),
        DedupConfig(method="minhash", threshold=0.5, verify=False),
        DedupConfig(method="minhash", shingle="char", ngram=5, threshold=0.7),
        DedupConfig(method="exact"),
    ],
    ids=["t0.5", "t0.8", "bands", "estimate", "char", "exact"],
)
def test_plan_and_report_equal_the_slow_reference(tmp_path, cfg):
    texts, ids = tangled()
    keep, lines = reference_plan(texts, ids, cfg)
    result = dedup(dataset(texts, ids), cfg, StageContext(out_dir=tmp_path))
    assert (tmp_path / REPORT).read_text(encoding="utf-8") == "".join(lines)
    assert result.data["id"] == [ids[i] for i in keep]
    sizes = [json.loads(line)["size"] for line in lines]
    if cfg.method == "minhash" and cfg.threshold == 0.5:
        assert max(sizes) >= 30 and len(sizes) >= 25  # the planted clusters are really there


@pytest.mark.parametrize("cfg", [DedupConfig(method="minhash", threshold=0.5), DedupConfig(method="exact")],
                         ids=["t0.5", "exact"])
def test_repeated_ids_raw_copies_and_awkward_strings_equal_the_slow_reference(tmp_path, cfg):
    """Ids shared by several rows (ranked by raw text, then row), rows that are the same raw text,
    and ids and texts that JSON must escape (quotes, backslashes, control characters, non-ASCII)."""
    texts, _ = tangled()
    n = len(texts)
    awkward = ['say "hi" \\ back\n\ttab \x01 \x7f end', "naïve café 😀 “quoted” \u2028 line", "ǅ ﬁ Ⅻ ① مرحبا"]
    texts += [t + " " + texts[k] for k, t in enumerate(awkward)]
    texts += [texts[5], texts[5].upper(), texts[5], texts[402], awkward[0], awkward[0].upper()]
    ids = [f'id"{k % 37}\\{"é" if k % 2 else "x"}' for k in range(len(texts))]
    for k in (5, n + 3, n + 5):  # one id and one raw text: the smallest row is kept
        ids[k] = ids[5]
    ids[n + 4] = "zzz"  # an exact copy ranked after them by id
    ids[n + 8] = ids[n + 7]  # one id: ranked by raw text, the later row first
    keep, lines = reference_plan(texts, ids, cfg)
    result = dedup(dataset(texts, ids), cfg, StageContext(out_dir=tmp_path))
    assert (tmp_path / REPORT).read_text(encoding="utf-8") == "".join(lines)
    assert result.data["id"] == [ids[i] for i in keep] and len(lines) >= 3


@pytest.mark.parametrize("cfg", [DedupConfig(method="minhash", threshold=0.5),
                                 DedupConfig(method="minhash", threshold=0.7, ngram=1, verify=False),
                                 DedupConfig(method="minhash", threshold=0.5, shingle="char", ngram=3)],
                         ids=["word3", "word1-estimate", "char3"])
def test_texts_with_the_same_shingles_but_other_normalized_texts_equal_the_slow_reference(tmp_path, cfg):
    """With word shingles the stage normalizes only texts whose shingle hashes (their sum) repeat:
    texts with the same words but other punctuation, spacing, case or word order, texts without a
    word and texts shorter than n words must still group exactly as their normalized texts do."""
    texts, _ = tangled()
    base = texts[7]
    words = base.split()
    texts += [base.replace(" ", ", ", 3), base.replace(" ", " - ", 2), base.upper(), "  " + base + "\t",
              "\n".join(words), " ".join(words[::-1]), " ".join(words[1:] + words[:1]),
              "!!", "! !", " !! ", "", "   ", "?", "\u2003?\u3000", "Two words", "two, words", "TWO  WORDS",
              "Straße STRASSE", "strasse straße", "STRASSE  STRASSE", "one", "One.", "o n e"]
    ids = [f"id{k:04d}" for k in range(len(texts))]
    keep, lines = reference_plan(texts, ids, cfg)
    result = dedup(dataset(texts, ids), cfg, StageContext(out_dir=tmp_path))
    assert (tmp_path / REPORT).read_text(encoding="utf-8") == "".join(lines)
    assert result.data["id"] == [ids[i] for i in keep]


@pytest.mark.parametrize("cfg", [DedupConfig(method="minhash", threshold=0.5), DedupConfig(method="exact")],
                         ids=["t0.5", "exact"])
def test_keep_test_whole_plan_and_report_equal_the_slow_reference(tmp_path, cfg):
    """A third of the tangled rows in test, by a hash of the row: clusters mixing the splits."""
    texts, ids = tangled()
    test = {i for i in range(len(texts)) if (i * 2654435761) % 7 < 3}
    keep, lines = reference_plan(texts, ids, cfg, test)
    splits = ["test" if i in test else "train" for i in range(len(texts))]
    cfg = DedupConfig(**{**cfg.__dict__, "keep_test_whole": True})
    result = dedup(split_dataset(texts, ids, splits), cfg, StageContext(out_dir=tmp_path))
    assert (tmp_path / REPORT).read_text(encoding="utf-8") == "".join(lines)
    assert result.data["id"] == [ids[i] for i in keep] and test <= set(keep)
    within = sum(len(json.loads(line)["kept_within_test"]) for line in lines)
    assert within == result.stats["test_split"]["kept_within_test"] > 0
    assert sum(bool(json.loads(line)["removed"]) and json.loads(line)["kept"] in {ids[i] for i in test}
               for line in lines) > 0  # clusters where a test row is kept over train rows are really there


# ---------------------------------------------------------------- dedup.keep_test_whole (benchmark mode)


def split_source() -> tuple[list[str], list[str], list[str]]:
    """20 train and 20 test texts of a source with its own split (texts, ids, source_split), with:
    a within-test exact copy (t01 of t00) and near copy (t03 of t02); a train copy of t04 that is
    longer (r00, kept over t04 by default); a train exact copy of t05 with a smaller id (r01) in a
    cluster with t05's test near copy t06; and a train-only pair (r03 a near copy of r02)."""
    base = unrelated(40, seed=7)
    train, test = base[:20], base[20:]
    test[1] = "  " + test[0].upper() + " "
    test[3] = edit(test[2], [5], "wn")  # J = 25/31 with t02, and shorter: t02 is kept
    train[0] = test[4] + " extra words"  # J = 28/30 with t04
    train[1] = test[5]
    test[6] = edit(test[5], [10], "m")
    train[2], train[3] = base[0], edit(base[0], [3], "tr")
    ids = [f"r{k:02d}" for k in range(20)] + [f"t{k:02d}" for k in range(20)]
    return train + test, ids, ["train"] * 20 + ["test"] * 20


def split_dataset(texts, ids, splits) -> Dataset:
    return Dataset.from_dict({"id": ids, "text": texts, "label": ["x"] * len(texts), "source_split": splits})


def entry(ids, texts, name, kind, sim) -> dict:
    return {"id": name, "kind": kind, "similarity": sim, "text": texts[ids.index(name)][:200]}


def test_keep_test_whole_removes_the_train_side_and_reports_within_test_copies(tmp_path):
    texts, ids, splits = split_source()
    cfg = DedupConfig(method="minhash", threshold=0.7, keep_test_whole=True)
    result = dedup(split_dataset(texts, ids, splits), cfg, StageContext(out_dir=tmp_path))
    assert result.data["id"] == [i for i in ids if i not in {"r00", "r01", "r03"}]  # every test row stays
    assert result.dropped == {"exact_duplicate": 1, "near_duplicate": 2}
    assert result.stats["test_split"] == {"rows": 20, "removed": 0, "kept_within_test": 3, "kept_whole": True}
    report = read_report(tmp_path / REPORT)
    e = lambda name, kind, sim: entry(ids, texts, name, kind, sim)  # noqa: E731
    assert {k: (v["size"], v["removed"], v["kept_within_test"]) for k, v in report.items()} == {
        "r02": (2, [e("r03", "near", round(25 / 31, 4))], []),
        "t00": (2, [], [e("t01", "exact", 1.0)]),
        "t02": (2, [], [e("t03", "near", round(25 / 31, 4))]),
        "t04": (2, [e("r00", "near", round(28 / 30, 4))], []),
        "t05": (3, [e("r01", "exact", 1.0)], [e("t06", "near", round(25 / 31, 4))]),
    }


def test_without_keep_test_whole_the_same_source_loses_test_rows(tmp_path):
    texts, ids, splits = split_source()
    result = dedup(split_dataset(texts, ids, splits), DedupConfig(method="minhash", threshold=0.7),
                   StageContext(out_dir=tmp_path))
    gone = {"t01", "t03", "t04", "t05", "t06", "r03"}  # r00 is longer than t04, r01's id smaller than t05's
    assert result.data["id"] == [i for i in ids if i not in gone]
    assert result.stats["test_split"] == {"rows": 20, "removed": 5, "kept_within_test": 0, "kept_whole": False}
    assert all("kept_within_test" not in line for line in read_report(tmp_path / REPORT).values())


def test_keep_test_whole_does_not_depend_on_row_order(tmp_path):
    texts, ids, splits = split_source()
    cfg = DedupConfig(method="minhash", threshold=0.7, keep_test_whole=True)
    outs = []
    for k, order in enumerate([list(range(40)), np.random.default_rng(3).permutation(40).tolist()]):
        (tmp_path / str(k)).mkdir()
        ds = split_dataset(*([v[i] for i in order] for v in (texts, ids, splits)))
        result = dedup(ds, cfg, StageContext(out_dir=tmp_path / str(k)))
        outs.append((sorted(result.data["id"]), result.dropped, (tmp_path / str(k) / REPORT).read_text()))
    assert outs[0] == outs[1]


def test_keep_test_whole_with_method_none_counts_the_test_split(tmp_path):
    texts, ids, splits = split_source()
    result = dedup(split_dataset(texts, ids, splits), DedupConfig(method="none", keep_test_whole=True),
                   StageContext(out_dir=tmp_path))
    assert len(result.data) == 40 and result.stats["test_split"]["rows"] == 20


def test_keep_test_whole_needs_a_source_test_split(tmp_path):
    texts, ids, _ = split_source()
    cfg = DedupConfig(keep_test_whole=True)
    with pytest.raises(ValueError, match=r"^dedup.keep_test_whole=true .* this source has none \(its splits: none\)"):
        dedup(split_dataset(texts, ids, [""] * 40), cfg, StageContext(out_dir=tmp_path))
    with pytest.raises(ValueError, match=r"this source has none \(its splits: \['train'\]\)"):
        dedup(split_dataset(texts, ids, ["train"] * 40), cfg, StageContext(out_dir=tmp_path))


def test_keep_test_whole_with_a_ratio_split_is_a_config_error():
    from pipeline.checks import load_config
    from pipeline.config import ConfigError

    tiny = Path(__file__).resolve().parents[3] / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"^dedup.keep_test_whole=true .* split.use_source_split=false"):
        load_config(tiny, ["dedup.keep_test_whole=true", "split.use_source_split=false"])
    assert load_config(tiny, ["dedup.keep_test_whole=true"]).dedup.keep_test_whole is True
