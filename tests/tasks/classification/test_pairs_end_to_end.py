"""Sentence-pair classification end to end on a JSONL of symmetric pairs: prepare (a pair and its swapped copy
one exact duplicate, the side check reported), train, a resume that equals the run that never stopped,
evaluate.py on torch and ONNX Runtime, and the final export giving evaluate.py's probabilities through
`pipeline()` with {"text", "text_pair"}; the Ray engine prepares the same stages."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.data.io import pair
from pipeline.training import signals
from pipeline.training.loop import train
from tests.accelkit import reset

WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture(scope="module")
def pairs_config(tmp_path_factory) -> Path:
    """240 pairs: 'same' a sentence and a shuffled copy of it, 'different' two unrelated sentences; 5 pairs
    appear again swapped (exact duplicates once stored in one order)."""
    root = tmp_path_factory.mktemp("pairs")
    rng = random.Random(0)
    rows = []
    for k in range(240):
        a = rng.sample(WORDS, rng.randint(4, 9))
        b = rng.sample(a, len(a)) if k % 2 else rng.sample(WORDS, rng.randint(4, 9))
        rows.append({"s1": " ".join(a), "s2": " ".join(b), "y": "same" if k % 2 else "different"})
    rows += [{"s1": r["s2"], "s2": r["s1"], "y": r["y"]} for r in rows[:5]]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tree = {
        "output_dir": str(root / "out"),
        "source": {"format": "jsonl", "path": str(root / "pairs.jsonl"), "text_field": "s1", "text_pair_field": "s2",
                   "label_field": "y", "symmetric_pairs": True},
        "dedup": {"method": "exact"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 32},
        "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.0, "log_every": 1, "eval_every": 3,
                  "save_every": 3, "keep_last": 5, "save_at_epoch_end": False, "max_steps": 6},
        "eval": {"batch_size": 16},
    }
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def _manifest(data: Path, stage: str) -> dict:
    return json.loads(next((data / "stages").glob(f"*-{stage}-*/manifest.json")).read_text())


def test_prepare_dedups_swapped_pairs_and_reports_the_side_check(pairs_config):
    from datasets import load_from_disk

    data = Path(load_config(pairs_config).output_dir) / "data"
    assert _manifest(data, "dedup")["dropped"]["exact_duplicate"] == 5
    sides = _manifest(data, "split")["stats"]["pair_sides"]
    assert set(sides) == {"validation", "test"} and all(set(v) == {"both_sides", "one_side"} for v in sides.values())
    tokenized = load_from_disk(str(next((data / "stages").glob("*-tokenize-*")) / "data"))
    row = tokenized["train"][0]
    first, second = pair.decode(row["text"])
    assert first <= second  # symmetric: stored in one order
    assert row["token_type_ids"][0] == 0 and row["token_type_ids"][-1] == 1


def test_a_pair_run_resumes_exactly_evaluates_on_both_runtimes_and_exports_to_pipeline(pairs_config, tmp_path):
    from transformers import pipeline

    from pipeline.evaluation.run import evaluate_checkpoint

    out = tmp_path / "run"
    shutil.copytree(Path(load_config(pairs_config).output_dir) / "data", out / "data", symlinks=True)
    cfg = load_config(pairs_config, [f"output_dir={out}"])
    reset()
    assert train(cfg, str(pairs_config)) == signals.EXIT_OK
    straight = load_file(str(out / "run" / "final" / "model.safetensors"))
    shutil.rmtree(out / "run" / "checkpoints" / "step-0000006")
    shutil.rmtree(out / "run" / "final")
    reset()
    assert train(cfg, str(pairs_config), resume="auto") == signals.EXIT_OK
    resumed = load_file(str(out / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    reset()
    metrics = evaluate_checkpoint(load_config(pairs_config, [f"output_dir={out}"]), str(pairs_config), progress=False)
    rows = [json.loads(x) for x in (Path(metrics["output_dir"]) / "predictions.jsonl").read_text().splitlines()]
    reset()
    ort = evaluate_checkpoint(load_config(pairs_config, [f"output_dir={out}", "eval.runtime=onnxruntime"]),
                              str(pairs_config), progress=False)
    assert ort["document"]["accuracy"] == metrics["document"]["accuracy"]

    from datasets import load_from_disk

    test = load_from_disk(str(next((out / "data" / "stages").glob("*-tokenize-*")) / "data"))["test"]
    classify = pipeline("text-classification", model=str(out / "run" / "final"), device="cpu")
    texts = {r["id"]: pair.decode(r["text"]) for r in test}
    got = classify([{"text": texts[r["id"]][0], "text_pair": texts[r["id"]][1]} for r in rows], top_k=None)
    for row, scores in zip(rows, got):
        ours = np.array([row["probabilities"][s["label"]] for s in scores])
        assert np.abs(ours - np.array([s["score"] for s in scores])).max() < 1e-5, row["id"]
