"""Two real gloo processes evaluate one split: every example comes back exactly once. The two ranks of
`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --mixed_precision no pipeline/evaluate.py`,
forked from the warm zygote with the environment the launcher gives them (trainkit.fork_ranks: no launcher, no
imports; the launcher itself: tests/training/test_multiprocess.py and tests/test_accelerate_configs.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_processes_gather_every_example_once_with_an_uneven_tail(world):
    import torch
    from transformers import AutoModelForSequenceClassification

    from tests.zygote import child_env, fork_ranks, wait_ranks

    # 13 examples in batches of 4 -> batches of 4, 4, 4, 1: process 0 runs 8 rows, process 1 runs 5 and pads 3
    env = {**child_env(), "ACCELERATE_USE_CPU": "true", "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO"}
    argv = [REPO / "pipeline" / "evaluate.py", "--config", world.config_path, "--quiet", "eval.batch_size=4"]
    log = world.run_dir.parent / "evaluate"
    codes = wait_ranks(fork_ranks(argv, 2, log, env), timeout=300)
    outputs = [log.with_name(f"evaluate-{r}.log").read_text(errors="replace") for r in (0, 1)]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert outputs[0].count("macro F1") == 1 and "macro F1" not in outputs[1]  # only the main process reports
    out = world.run_dir / "eval" / "test-final"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["processes"] == 2
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [(r["id"], r["chunk"]) for r in rows] == [(r[0], r[1]) for r in world.test_rows]  # each once, in order
    assert metrics["chunk"]["examples"] == 13 and sum(map(sum, metrics["chunk"]["confusion_matrix"])) == 13

    # and each row holds its own example's probabilities (no shuffle between processes)
    import datasets

    ds = datasets.load_from_disk(str(world.stage_dir / "data"))["test"]
    model = AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval()
    with torch.inference_mode():
        want = np.concatenate([model(input_ids=torch.tensor([ids])).logits.softmax(-1).numpy() for ids in ds["input_ids"]])
    got = np.array([[r["probabilities"][n] for n in world.label_names] for r in rows])
    np.testing.assert_allclose(got, want, atol=1e-4)
