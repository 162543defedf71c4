"""task=regression end to end on a CSV of float targets: prepare (a stratified split by the targets' quantile bins,
the label stage's float32 targets), train (MSE; validation ranks checkpoints by Pearson), a resume that equals the
run that never stopped, evaluate.py's metrics and report, and the final export scoring raw through pipeline()."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.training import signals
from pipeline.training.loop import train
from tests.accelkit import reset

WORDS = [f"w{i}" for i in range(30)]


@pytest.fixture(scope="module")
def regression_config(tmp_path_factory) -> Path:
    """300 rows whose target is half the count of 'w1' in the text plus noise; three rows without a label."""
    root = tmp_path_factory.mktemp("regression")
    rng = random.Random(0)
    with open(root / "scores.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "score"])
        for k in range(300):
            words = rng.choices(WORDS, k=rng.randint(3, 12))
            score = "" if k % 100 == 7 else f"{0.5 * words.count('w1') + rng.uniform(0, 0.2):.3f}"
            writer.writerow([" ".join(words) + f" n{k}", score])
    tree = {
        "output_dir": str(root / "out"), "task": "regression",
        "source": {"format": "csv", "path": str(root / "scores.csv"), "text_field": "sentence", "label_field": "score"},
        "dedup": {"method": "exact"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 32},
        "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "train": {"epochs": 1, "batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.0, "log_every": 1, "eval_every": 3,
                  "save_every": 3, "keep_last": 5, "save_at_epoch_end": False, "metric_for_best": "pearson",
                  "max_steps": 6},
        "eval": {"batch_size": 16},
    }
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def test_prepare_gives_float_targets_and_a_split_stratified_by_target(regression_config):
    from datasets import Value, load_from_disk

    data = Path(load_config(regression_config).output_dir) / "data"
    info = json.loads((data / "prepared.json").read_text())["data_info"]
    assert info["target"] == "score" and info["scale"][0] >= 0 and info["train_mean"] > 0
    label = json.loads(next((data / "stages").glob("*-label-*/manifest.json")).read_text())
    assert label["dropped"] == {"missing_label": 3} and label["stats"]["scale_from"] == "found"
    counts = {s: label["stats"]["targets"][s]["count"] for s in ("train", "validation", "test")}
    assert sum(counts.values()) == 297 and min(counts.values()) >= 20, counts
    tokenized = load_from_disk(str(next((data / "stages").glob("*-tokenize-*")) / "data"))
    assert tokenized["train"].features["label"] == Value("float32")


def test_a_regression_run_resumes_exactly_evaluates_and_exports(regression_config, tmp_path):
    from transformers import AutoTokenizer, pipeline

    from pipeline.evaluation.run import evaluate_checkpoint

    out = tmp_path / "run"
    shutil.copytree(Path(load_config(regression_config).output_dir) / "data", out / "data", symlinks=True)
    cfg = load_config(regression_config, [f"output_dir={out}"])
    reset()
    assert train(cfg, str(regression_config)) == signals.EXIT_OK
    straight = load_file(str(out / "run" / "final" / "model.safetensors"))
    shutil.rmtree(out / "run" / "checkpoints" / "step-0000006")
    shutil.rmtree(out / "run" / "final")
    reset()
    assert train(cfg, str(regression_config), resume="auto") == signals.EXIT_OK
    resumed = load_file(str(out / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    reset()
    metrics = evaluate_checkpoint(load_config(regression_config, [f"output_dir={out}"]), str(regression_config),
                                  progress=False)
    assert metrics["target"] == "score" and metrics["chunk"]["examples"] == metrics["document"]["examples"]
    assert set(metrics["document"]) >= {"pearson", "spearman", "mse", "mae", "rmse"}
    report = Path(metrics["output_dir"])
    assert (report / "scatter.png").is_file() and (report / "predictions.jsonl").is_file()
    row = json.loads((report / "predictions.jsonl").read_text().splitlines()[0])
    assert set(row) == {"id", "chunk", "text", "target", "prediction"}

    final = out / "run" / "final"
    scorer = pipeline("text-classification", model=str(final), tokenizer=AutoTokenizer.from_pretrained(final),
                      device="cpu")
    rows = [json.loads(x) for x in (report / "predictions.jsonl").read_text().splitlines()]
    import datasets

    test = datasets.load_from_disk(str(next((out / "data" / "stages").glob("*-tokenize-*")) / "data"))["test"]
    texts = dict(zip(test["id"][:], test["text"][:]))
    for row, got in zip(rows, scorer([texts[r["id"]] for r in rows])):  # the raw output, no sigmoid
        assert got["label"] == "score" and abs(got["score"] - row["prediction"]) < 1e-5, row["id"]

    for runtime in ("eval.runtime=onnxruntime", "eval.precision=int8"):
        reset()
        other = evaluate_checkpoint(load_config(regression_config, [f"output_dir={out}", runtime]),
                                    str(regression_config), progress=False)
        assert abs(other["document"]["mse"] - metrics["document"]["mse"]) <= 0.05 * metrics["document"]["mse"], runtime
