"""task=multilabel end to end on a JSONL source whose labels are a list column: prepare (a multi-hot label), train
(BCE), a resume that equals the run that never stopped, thresholds tuned on validation into final/config.json,
evaluate.py at those thresholds, and the export through transformers.pipeline() (a sigmoid per label)."""

from __future__ import annotations

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

TOPICS = {"arts": ["paint", "stage", "poem", "opera"], "politics": ["vote", "senate", "law", "party"],
          "sports": ["goal", "match", "coach", "league"]}
FILLER = [f"w{i}" for i in range(30)]


@pytest.fixture(scope="module")
def tags_config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multilabel")
    rng = random.Random(0)
    rows = []
    for k in range(240):
        tags = rng.sample(sorted(TOPICS), rng.choice([0, 1, 1, 2]))
        words = [w for t in tags for w in rng.sample(TOPICS[t], 2)] + rng.choices(FILLER, k=rng.randint(3, 8))
        rng.shuffle(words)
        rows.append({"id": f"r{k}", "body": f"{k} " + " ".join(words), "tags": tags})
    (root / "tags.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tree = {
        "output_dir": str(root / "out"), "task": "multilabel",
        "source": {"format": "jsonl", "path": str(root / "tags.jsonl"), "text_field": "body", "label_field": "tags",
                   "id_field": "id"},
        "dedup": {"method": "exact"}, "split": {"train": 0.8, "validation": 0.1, "test": 0.1, "stratify": True},
        "label": {"names": [], "tune_thresholds": True},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 32},
        "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                  "dropout": 0.1},
        "train": {"epochs": 1, "batch_size": 8, "lr": 3e-3, "warmup_ratio": 0.0, "log_every": 1, "eval_every": 3,
                  "save_every": 3, "keep_last": 5, "save_at_epoch_end": False, "metric_for_best": "micro_f1",
                  "group_by_length": False, "max_steps": 6},
        "eval": {"batch_size": 16},
    }
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def test_prepared_labels_are_multi_hot_over_the_sorted_tags(tags_config):
    out = Path(load_config(tags_config).output_dir)
    info = json.loads((out / "data" / "prepared.json").read_text())["data_info"]
    assert info["label_names"] == ["arts", "politics", "sports"] and info["threshold"] == 0.5
    source = {json.loads(line)["id"]: json.loads(line)["tags"] for line in (out.parent / "tags.jsonl").read_text().splitlines()}
    import datasets

    train = datasets.load_from_disk(str(next((out / "data" / "stages").glob("*-tokenize-*")) / "data"))["train"]
    for doc_id, hot in zip(train["id"][:], train["label"][:]):
        assert [n for n, v in zip(info["label_names"], hot) if v] == sorted(source[doc_id])


def test_a_multilabel_run_resumes_exactly_tunes_its_thresholds_evaluates_and_exports(tags_config, tmp_path):
    from transformers import pipeline

    from pipeline.evaluation.run import evaluate_checkpoint

    out = tmp_path / "run"
    shutil.copytree(Path(load_config(tags_config).output_dir) / "data", out / "data", symlinks=True)
    cfg = load_config(tags_config, [f"output_dir={out}"])
    reset()
    assert train(cfg, str(tags_config)) == signals.EXIT_OK
    straight = load_file(str(out / "run" / "final" / "model.safetensors"))
    tuned = json.loads((out / "run" / "final" / "config.json").read_text())["label_thresholds"]
    shutil.rmtree(out / "run" / "checkpoints" / "step-0000006")
    shutil.rmtree(out / "run" / "final")
    reset()
    assert train(cfg, str(tags_config), resume="auto") == signals.EXIT_OK
    resumed = load_file(str(out / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert json.loads((out / "run" / "final" / "config.json").read_text())["label_thresholds"] == tuned

    conf = json.loads((out / "run" / "final" / "config.json").read_text())
    assert conf["problem_type"] == "multi_label_classification"
    assert sorted(conf["label_thresholds"]) == ["arts", "politics", "sports"]
    assert all(0 < t < 1 for t in conf["label_thresholds"].values())

    metrics = evaluate_checkpoint(load_config(tags_config, [f"output_dir={out}", "eval.split=test"]), str(tags_config),
                                  progress=False)
    assert metrics["thresholds"] == conf["label_thresholds"]
    for level in ("chunk", "document"):
        assert 0 <= metrics[level]["micro_f1"] <= 1 and set(metrics[level]["per_label"]) == set(conf["label_thresholds"])
    report = Path(metrics["output_dir"])
    assert {"metrics.json", "predictions.jsonl", "documents.jsonl", "per_label.csv"} <= {p.name for p in report.iterdir()}

    classify = pipeline("text-classification", model=str(out / "run" / "final"), device="cpu", top_k=None)
    rows = [json.loads(x) for x in (report / "predictions.jsonl").read_text().splitlines()]
    import datasets

    test = datasets.load_from_disk(str(next((out / "data" / "stages").glob("*-tokenize-*")) / "data"))["test"]
    texts = dict(zip(test["id"][:], test["text"][:]))
    for row, got in zip(rows, classify([texts[r["id"]] for r in rows])):  # sigmoids, as evaluate.py's
        assert set(row["probabilities"]) == {d["label"] for d in got}
        assert max(abs(row["probabilities"][d["label"]] - d["score"]) for d in got) < 1e-5, row["id"]

    for runtime in ("eval.runtime=onnxruntime", "eval.precision=int8"):  # the same thresholds, the same report
        reset()
        other = evaluate_checkpoint(load_config(tags_config, [f"output_dir={out}", "eval.split=test", runtime]),
                                    str(tags_config), progress=False)
        assert other["thresholds"] == conf["label_thresholds"]
        assert abs(other["document"]["micro_f1"] - metrics["document"]["micro_f1"]) <= 0.05, runtime


@pytest.mark.slow  # two runs; the loss's arithmetic in the fast tier: test_loop.py's hand computation
def test_a_multilabel_run_trains_with_balanced_label_weights_and_smoothed_targets(tags_config, tmp_path):
    """train.class_weights=balanced weighs each label's term by its train rows, train.label_smoothing=0.2 moves
    the targets to 0.1 and 0.9: the run trains (its loss falls from the first step), and its first loss is not
    the plain BCE's of the same model on the same batch (the plain run: the test above)."""
    out = tmp_path / "run"
    shutil.copytree(Path(load_config(tags_config).output_dir) / "data", out / "data", symlinks=True)
    over = [f"output_dir={out}", "train.class_weights=balanced", "train.label_smoothing=0.2"]
    reset()
    assert train(load_config(tags_config, over), str(tags_config)) == signals.EXIT_OK
    losses = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in losses if "loss" in r and "eval" not in r]
    plain = tmp_path / "plain"
    shutil.copytree(Path(load_config(tags_config).output_dir) / "data", plain / "data", symlinks=True)
    reset()
    assert train(load_config(tags_config, [f"output_dir={plain}"]), str(tags_config)) == signals.EXIT_OK
    first = json.loads((plain / "run" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert losses[0] != first and min(losses[1:]) < losses[0]
