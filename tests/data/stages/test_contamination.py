"""The split stage's n-gram contamination check on planted overlaps, at exact counts: validation/test documents
sharing a 13-word run with train (in other case and punctuation), runs of 12 words that are not found, documents
too short to hold an n-gram; train against evaluation files; report and remove; contamination.jsonl; and the
same rows, counts and file on the Ray engine."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from pipeline.config import DedupConfig, SplitConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import SPLITS
from pipeline.data.stages import split

VOCAB = [f"v{k}" for k in range(5000)]


def _words(rng, n):
    return [rng.choice(VOCAB) for _ in range(n)]


def _planted(tmp_path: Path):
    """60 train documents of 40 words. Validation: 10 holding a 13-word run of train document k (1 n-gram,
    13 of 40 words), 5 holding 15 words of one (3 n-grams), 5 holding 12 words (none), 10 unrelated, 4 of 8
    words. Test: 6 holding 14 words of one, in capitals with commas (2 n-grams), 10 unrelated. A benchmark
    file: 3 documents holding 13-word runs of train documents 50, 51, 52."""
    import datasets

    rng = random.Random(11)
    train = [_words(rng, 40) for _ in range(60)]
    rows = [(f"t{k:03d}", " ".join(w), "train") for k, w in enumerate(train)]

    def copy(k, length, start=5):
        return train[k][start:start + length]

    val = [_words(rng, 13) + copy(k, 13) + _words(rng, 14) for k in range(10)]
    val += [_words(rng, 10) + copy(10 + k, 15) + _words(rng, 15) for k in range(5)]
    val += [_words(rng, 14) + copy(20 + k, 12) + _words(rng, 14) for k in range(5)]
    val += [_words(rng, 40) for _ in range(10)] + [_words(rng, 8) for _ in range(4)]
    rows += [(f"v{k:03d}", " ".join(w), "validation") for k, w in enumerate(val)]
    test = [_words(rng, 20) + [w.upper() + "," for w in copy(30 + k, 14)] + _words(rng, 6) for k in range(6)]
    test += [_words(rng, 40) for _ in range(10)]
    rows += [(f"s{k:03d}", " ".join(w), "test") for k, w in enumerate(test)]
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"id": f"b{k}", "text": "Q: " + " ".join(copy(50 + k, 13)) + "?"}) + "\n"
                             for k in range(3)) + json.dumps({"text": "nothing here"}) + "\n", encoding="utf-8")
    ids, texts, splits = zip(*rows)
    datasets.Dataset.from_dict({"id": list(ids), "text": list(texts), "label": [""] * len(ids),
                                "source_split": list(splits)}).save_to_disk(str(tmp_path / "docs"))
    return datasets.load_from_disk(str(tmp_path / "docs")), bench


def _run(ds, cfg, out: Path, engine):
    out.mkdir(parents=True, exist_ok=True)
    with engine.stage(out / "stage"):
        r = split.split(ds, cfg, StageContext(out_dir=out, engine=engine, progress=False, similarity=DedupConfig()))
        rows = {s: r.data[s].to_list() for s in SPLITS}
    return rows, r.dropped, r.stats, [json.loads(x) for x in (out / "contamination.jsonl").read_text().splitlines()]


def test_planted_overlaps_are_found_at_exact_counts_and_reported(tmp_path):
    ds, bench = _planted(tmp_path)
    cfg = SplitConfig(leakage="off", contamination="report", contamination_files=[str(bench)])
    rows, dropped, stats, hits = _run(ds, cfg, tmp_path / "local", LocalEngine())
    assert dropped == {} and {s: len(rows[s]) for s in SPLITS} == {"train": 60, "validation": 34, "test": 16}
    checks = {(c["split"], c["against"]): c for c in stats["contamination"]["checks"]}
    assert checks[("validation", "train")] == {"split": "validation", "against": "train", "documents": 34,
                                               "too_short": 4, "contaminated": 15}
    assert checks[("test", "train")]["contaminated"] == 6
    assert checks[("train", "contamination_files")] == {"split": "train", "against": "contamination_files",
                                                        "documents": 60, "too_short": 0, "contaminated": 3}
    by = {(h["split"], h["id"]): h for h in hits}
    assert len(hits) == 24
    v0 = by[("validation", "v000")]
    assert v0["reference_ids"] == ["t000"] and v0["ngrams_found"] == 1 and v0["overlap"] == round(13 / 40, 4)
    assert v0["ngram"] == " ".join(ds[0]["text"].split()[5:18]) and v0["removed"] is None
    assert [by[("validation", f"v{k:03d}")]["ngrams_found"] for k in range(10, 15)] == [3] * 5
    assert by[("validation", "v010")]["overlap"] == round(15 / 40, 4)
    assert not any(("validation", f"v{k:03d}") in by for k in range(15, 34))  # 12 words, unrelated, short
    assert by[("test", "s002")]["ngrams_found"] == 2 and by[("test", "s002")]["reference_ids"] == ["t032"]
    assert [by[("train", f"t{50 + k:03d}")]["reference_ids"] for k in range(3)] == [["b0"], ["b1"], ["b2"]]


def test_remove_drops_the_contaminated_documents_from_their_split(tmp_path):
    ds, bench = _planted(tmp_path)
    cfg = SplitConfig(leakage="off", contamination="remove", contamination_files=[str(bench)])
    rows, dropped, stats, hits = _run(ds, cfg, tmp_path / "local", LocalEngine())
    assert dropped == {"contaminated_validation": 15, "contaminated_test": 6, "contaminated_train": 3}
    assert {s: len(rows[s]) for s in SPLITS} == {"train": 57, "validation": 19, "test": 10}
    assert not {r["id"] for s in SPLITS for r in rows[s]} & {h["id"] for h in hits}
    assert {h["removed"] for h in hits} == {"validation", "test", "train"}


def test_with_the_test_split_kept_whole_train_and_validation_are_checked_against_test(tmp_path):
    """dedup.keep_test_whole: the test split is the benchmark and the reference; the train documents whose text
    test's 6 planted documents copy are flagged (and removed), never the test documents; the records name both
    sides. The docs said it flagged validation/test documents."""
    ds, _ = _planted(tmp_path)
    cfg = SplitConfig(leakage="off", contamination="remove")
    out = tmp_path / "whole"
    out.mkdir()
    with LocalEngine().stage(out / "stage"):
        r = split.split(ds, cfg, StageContext(out_dir=out, engine=LocalEngine(), progress=False,
                                              similarity=DedupConfig(keep_test_whole=True)))
        sizes = {s: r.data[s].num_rows for s in SPLITS}
    hits = [json.loads(x) for x in (out / "contamination.jsonl").read_text().splitlines()]
    checks = [(c["split"], c["against"], c["contaminated"]) for c in r.stats["contamination"]["checks"]]
    assert checks == [("train", "test", 6), ("validation", "test", 0), ("validation", "train", 15)]
    from_test = sorted((h["id"], h["reference_ids"]) for h in hits if h["against"] == "test")
    assert from_test == [(f"t{30 + k:03d}", [f"s{k:03d}"]) for k in range(6)]  # the train side flagged, test named
    assert not any(h["split"] == "test" for h in hits) and sizes["test"] == 16
    assert r.dropped == {"contaminated_train": 6, "contaminated_validation": 15} and sizes["train"] == 54


def test_the_check_can_be_off_and_a_bad_evaluation_file_is_one_line(tmp_path):
    ds, _ = _planted(tmp_path)
    out = tmp_path / "off"
    out.mkdir()
    r = split.split(ds, SplitConfig(leakage="off", contamination="off"),
                    StageContext(out_dir=out, progress=False, similarity=DedupConfig()))
    assert r.stats["contamination"] == {} and not (out / "contamination.jsonl").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{bad}:2: no 'text' \(a string\) or 'messages' field; keys: txt$"):
        split.split(ds, SplitConfig(leakage="off", contamination_files=[str(bad)]),
                    StageContext(out_dir=out, progress=False, similarity=DedupConfig()))


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 3])
def test_the_check_on_ray_equals_the_local_engine(tmp_path, ray_cluster, monkeypatch, blocks):
    """The same rows, counts and contamination.jsonl (the leakage check on too); and with the leakage check off,
    the driver selects no rows: the removal is a filter in the tasks, the records come back from them."""
    import dataclasses

    import datasets
    import ray

    from pipeline.config import RayConfig
    from pipeline.data.engines.ray.engine import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ds, bench = _planted(tmp_path)
    engine = RayEngine.connect(RayConfig(blocks=blocks))
    for policy in ("report", "remove"):
        cfg = SplitConfig(leakage_threshold=0.5, contamination=policy, contamination_files=[str(bench)])
        local = _run(ds, cfg, tmp_path / f"local-{policy}", LocalEngine())
        assert _run(ds, cfg, tmp_path / f"ray-{policy}", engine) == local and len(local[3]) == 24
        assert (tmp_path / f"ray-{policy}" / "contamination.jsonl").read_bytes() == \
            (tmp_path / f"local-{policy}" / "contamination.jsonl").read_bytes()
        selects, select = [], datasets.Dataset.select
        with monkeypatch.context() as m:
            m.setattr(datasets.Dataset, "select",
                      lambda self, rows, *a, **k: selects.append(len(rows)) or select(self, rows, *a, **k))
            quiet = _run(ds, dataclasses.replace(cfg, leakage="off"), tmp_path / f"ray-off-{policy}", engine)
        assert not selects and quiet[1] == local[1] and len(quiet[3]) == 24
