"""Regression and multi-label under 2 gloo processes (the ranks `accelerate launch --config_file
configs/accelerate/cpu_multiprocess.yaml` starts, forked from the warm zygote with the environment it gives them:
trainkit.fork_launch_ranks; the launcher itself: test_multiprocess.py) match one process with the same global batch, step by step, as test_multiprocess.py checks single-label
classification (its docstring says why 1e-5): each rank pads its pairs' token types (the regression source is
sentence pairs), collates its float or multi-hot targets, and the multilabel run's end-of-training threshold tuning
(a collective predict over validation) finishes on both ranks and writes the thresholds once. The one-process run
trains in this process (multikit.train_here) beside the launched pair, on a copy of the same prepared data.

Sentence-pair classification had a 2-process run of its own here: its batches are classification's collator with a
pair's token types, which the regression run's collator (a subclass changing only the targets) pads per rank, and
classification's integer targets, which test_multiprocess.py's runs collate; its pair data path, in one process:
tests/tasks/classification/test_pairs_end_to_end.py."""

from __future__ import annotations

import json
import random

import pytest
import yaml

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from tests.training.multikit import log_of, train_here
from tests.training.trainkit import (
    clone_prepared,
    final_weights,
    fork_launch_ranks,
    log_text,
    records,
    run_dir,
)
from tests.zygote import wait_ranks

pytestmark = pytest.mark.slow

TOL = 1e-5
STEPS = 8
KINDS = {
    "regression": {"task": "regression", "source": {"text_pair_field": "b", "label_field": "score"},
                   "label": {"scale": [0, 5]}, "train": {"metric_for_best": "pearson"}},
    "multilabel": {"task": "multilabel", "source": {"label_field": "tags"}, "train": {"metric_for_best": "micro_f1"}},
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = random.Random(11)
    words = [f"w{k}" for k in range(50)]
    rows = []
    for k in range(200):
        a = rng.sample(words, rng.randint(3, 9))
        b = rng.sample(a, len(a)) if k % 2 else rng.sample(words, rng.randint(3, 9))
        rows.append({"a": " ".join(a), "b": " ".join(b),
                     "score": round(rng.uniform(0, 5), 2), "tags": rng.sample(["x", "y", "z"], rng.choice([0, 1, 2]))})
    path = tmp_path_factory.mktemp("kinds") / "kinds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _config(folder, source, kind: str):
    spec = KINDS[kind]
    tree = {
        "output_dir": str(folder / "out"), "task": spec["task"],
        "source": {"format": "jsonl", "path": str(source), "text_field": "a", **spec["source"]},
        "label": spec.get("label", {}), "dedup": {"method": "exact"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 32},
        "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
                  "dropout": 0.0},
        "train": {"epochs": 1, "max_steps": STEPS, "batch_size": 8, "lr": 3e-3, "log_every": 1, "eval_every": 4,
                  "save_every": 4, "keep_last": 10, "save_at_epoch_end": False, **spec["train"]},
    }
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


@pytest.mark.parametrize("kind", list(KINDS))
def test_two_processes_match_one_process_for_each_kind(tmp_path, source, kind):
    one = _config(tmp_path / "one", source, kind)
    two = clone_prepared(one, tmp_path / "two")
    multi = fork_launch_ranks(two)
    try:
        single = train_here(one, "train.batch_size=16")
    finally:
        codes = wait_ranks(multi, timeout=300)
    assert [single, *codes] == [0, 0, 0], log_text(one)[-2000:] + log_of(two, "multi-0")[-3000:]
    a = [(r["step"], r["loss"]) for r in records(run_dir(one))]
    b = [(r["step"], r["loss"]) for r in records(run_dir(two))]
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, STEPS + 1))
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) <= TOL, (a, b)
    wa, wb = final_weights(run_dir(one)), final_weights(run_dir(two))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= TOL
    if kind == "multilabel":
        for config in (one, two):
            final = json.loads((run_dir(config) / "final" / "config.json").read_text())
            assert sorted(final["label_thresholds"]) == ["x", "y", "z"]
            tuned = [r for r in records(run_dir(config), "all") if r.get("event") == "final_config"]
            assert len(tuned) == 1 and tuned[0]["label_thresholds"] == final["label_thresholds"]
