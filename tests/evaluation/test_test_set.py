"""metrics.json's test_set: which test set was scored, from the prepare manifests. End to end on the
tiny config with a source that has its own train/validation/test split (dedup.keep_test_whole on and
off), and each wording from hand-made manifests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.evaluation.run import describe_test_set as describe

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"
LABELS = ["negative", "neutral", "positive"]


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}q{rng.integers(1000)}" for i in range(3000)]
    return [" ".join(rng.choice(vocab, 30)) for _ in range(n)]


def _edit(text: str, positions: list[int]) -> str:
    words = text.split()
    for p in positions:
        words[p] = f"edited{p}"
    return " ".join(words)


def write_source(path: Path) -> None:
    """40 train, 10 validation, 20 test rows. Within test: t01 an exact copy of t00, t03 a near copy
    of t02, t06 of t05. Across: train r00 a longer copy of t04, r01 a copy of t05, and r02 two words
    off t07 (J = 22/34: under dedup's 0.7, over the leakage check's 0.5 set below)."""
    base = _texts(70, seed=4)
    train, val, test = base[:40], base[40:50], base[50:]
    test[1] = "  " + test[0].upper()
    test[3], test[6] = _edit(test[2], [5]), _edit(test[5], [10])
    train[0], train[1], train[2] = test[4] + " extra words", test[5], _edit(test[7], [8, 20])
    parts = (("r", train, "train"), ("v", val, "validation"), ("t", test, "test"))
    rows = [(f"{prefix}{k:02d}", t, split) for prefix, part, split in parts for k, t in enumerate(part)]
    with open(path, "w", encoding="utf-8") as f:
        for k, (i, text, split) in enumerate(rows):
            f.write(json.dumps({"id": i, "text": text, "sentiment": LABELS[k % 3], "split": split}) + "\n")


def prepare_and_evaluate(tmp_path: Path, untrained_model, *extra: str) -> tuple[dict, Path]:
    from transformers import PreTrainedTokenizerFast

    from pipeline.data.prepared import load_prepared
    from tests.evaluation.test_run import _main

    src = tmp_path / "source.jsonl"
    write_source(src)
    args = [f"output_dir={tmp_path / 'out'}", "source.format=jsonl", f"source.path={src}", "source.package=",
            "source.encoding=utf-8", "source.id_field=id", "source.split_field=split", "source.sample=1.0",
            "split.leakage_threshold=0.5", *extra]
    cfg = load_config(TINY, args)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    prepared = load_prepared(cfg, tasks.get(cfg.task))
    untrained_model(cfg.run_dir, PreTrainedTokenizerFast.from_pretrained(prepared.tokenizer_dir), prepared.info["label_names"])
    assert _main(["--config", str(TINY), "--split", "test", "--quiet", *args]) == 0
    return json.loads((cfg.run_dir / "eval" / "test-final" / "metrics.json").read_text()), cfg.data_dir / "stages"


def _lines(stages: Path, stage: str, name: str) -> list[dict]:
    (folder,) = stages.glob(f"*-{stage}-*")
    return [json.loads(line) for line in (folder / name).read_text(encoding="utf-8").splitlines()]


def test_official_test_split_kept_whole_end_to_end(tmp_path, untrained_model):
    metrics, stages = prepare_and_evaluate(tmp_path, untrained_model, "dedup.keep_test_whole=true")
    assert metrics["test_set"] == "official (all 20 rows kept; 3 within-test copies reported)"
    assert metrics["document"]["examples"] == 20
    clusters = {c["kept"]: c for c in _lines(stages, "dedup", "clusters.jsonl")}
    ids = {k: ([r["id"] for r in c["removed"]], [r["id"] for r in c["kept_within_test"]]) for k, c in clusters.items()}
    assert ids == {"t00": ([], ["t01"]), "t02": ([], ["t03"]), "t04": (["r00"], []), "t05": (["r01"], ["t06"])}
    leaks = _lines(stages, "split", "leakage.jsonl")
    assert [(r["split"], r["id"], r["test_id"], r["removed"]) for r in leaks] == [("train", "r02", "t07", "train")]


@pytest.mark.slow  # the fast tier's prepare-and-evaluate of a test_set: the one above
def test_deduplicated_test_split_end_to_end(tmp_path, untrained_model):
    metrics, stages = prepare_and_evaluate(tmp_path, untrained_model)
    assert metrics["test_set"] == "deduplicated (14 of 20 rows; 5 removed by dedup, 1 by the leakage check)"
    assert metrics["document"]["examples"] == 14
    leaks = _lines(stages, "split", "leakage.jsonl")
    assert [(r["split"], r["id"], r["train_id"], r["removed"]) for r in leaks] == [("test", "t07", "r02", "test")]


def _manifests(test_split: dict | None, kept: bool = True, leak_test: int = 0, clean_dropped: int = 0) -> dict:
    return {
        "clean": {"dropped": {"too_short": clean_dropped} if clean_dropped else {}},
        "dedup": {"stats": {"test_split": test_split} if test_split else {}},
        "split": {"stats": {"source_split_kept": kept}, "dropped": {"leak_test": leak_test} if leak_test else {}},
    }


def test_each_wording_from_the_manifests():
    whole = {"rows": 25000, "removed": 0, "kept_within_test": 215, "kept_whole": True}
    assert describe(_manifests(whole), 25000) == "official (all 25000 rows kept; 215 within-test copies reported)"
    assert describe(_manifests(whole), 24990) == (
        "official (24990 of 25000 rows, 10 dropped after dedup; 215 within-test copies reported)")
    deduped = {"rows": 25000, "removed": 215, "kept_within_test": 0, "kept_whole": False}
    assert describe(_manifests(deduped, leak_test=3, clean_dropped=7), 24782) == (
        "deduplicated (24782 of 25000 rows; 215 removed by dedup, 3 by the leakage check; "
        "clean dropped 7 rows of any split before dedup)")
    with_ngrams = _manifests(deduped, leak_test=3)
    with_ngrams["split"]["dropped"]["contaminated_test"] = 4
    assert describe(with_ngrams, 24778) == (
        "deduplicated (24778 of 25000 rows; 215 removed by dedup, 3 by the leakage check, 4 by the n-gram "
        "contamination check)")
    assert describe(_manifests(None, kept=False), 230) == (
        "held out by hash (230 documents; split.test of the rows, not a split of the source)")
    assert describe({}, 10).startswith("unknown (10 documents;")


def test_a_world_without_the_earlier_manifests_says_unknown(world):
    from tests.evaluation.test_run import _main

    assert _main(["--config", str(world.config_path), "--split", "test", "--quiet", "eval.batch_size=4"]) == 0
    metrics = json.loads((world.run_dir / "eval" / "test-final" / "metrics.json").read_text())
    assert metrics["test_set"].startswith("unknown (10 documents;")
    assert _main(["--config", str(world.config_path), "--split", "validation", "--quiet"]) == 0
    assert json.loads((world.run_dir / "eval" / "validation-final" / "metrics.json").read_text())["test_set"] is None
