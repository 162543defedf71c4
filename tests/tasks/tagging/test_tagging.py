"""A task that exists only in the tests (task.py beside this file) runs through the three commands once it is
registered: a new task is its folder and one registry line, and no shared file knows it."""

from __future__ import annotations

import json

import yaml

from pipeline import artifacts, tasks
from tests.accelkit import reset
from tests.tasks.tagging import task as tagging
from tests.training.trainkit import toy_rows


def test_a_task_registered_from_a_test_prepares_trains_evaluates_and_gets_its_card(tmp_path, monkeypatch):
    from pipeline import evaluate, prepare, train

    monkeypatch.setitem(tasks.TASKS, "tagging", tagging.TASK)  # the registry line
    rows = toy_rows(240, seed=5)
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in rows),
                                        encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "out"), "task": "tagging",
        "source": {"format": "jsonl", "path": str(tmp_path / "toy.jsonl"), "label_field": "", "id_field": "id"},
        "dedup": {"method": "exact"}, "split": {"stratify": False, "contamination": "off"},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 32},
        "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "train": {"epochs": 3, "batch_size": 16, "lr": 5e-3, "warmup_ratio": 0.0, "eval_every": 10, "save_every": 10,
                  "metric_for_best": "token_accuracy", "report_to": []},
    }), encoding="utf-8")
    args = ["--config", str(config)]
    assert prepare.main([*args, "--quiet"]) == 0
    prepared = artifacts.read_json(tmp_path / "out" / "data" / "prepared.json")
    assert (prepared["task"], prepared["data_info"]) == ("tagging", {"tags": ["O", "CUE"]})
    reset()
    assert train.main(args) == 0
    reset()
    assert evaluate.main([*args, "--split", "test", "--quiet"]) == 0
    run = tmp_path / "out" / "run"
    metrics = artifacts.read_json(run / "eval" / "test-final" / "metrics.json")
    assert metrics["token"]["token_accuracy"] > 0.95  # a cue word is a token of its own: easy to learn
    assert metrics["token"]["examples"] == len((run / "eval" / "test-final" / "tokens.jsonl").read_text().splitlines())
    validations = [r["eval"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval" in r]
    assert validations and all(set(v) >= {"token_accuracy", "loss"} for v in validations)
    card = (run / "final" / "README.md").read_text(encoding="utf-8")
    assert "A token tagger: a bert of 1 layers" in card and "Cue tokens in train" in card
    assert "pipeline_tag: token-classification" in card and "Token accuracy (test)" in card
    assert json.loads((run / "final" / "config.json").read_text())["architectures"] == ["BertForTokenClassification"]
