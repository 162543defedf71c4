"""Two real gloo processes (accelerate launch) evaluate one split: every example comes back exactly once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_gather_every_example_once_with_an_uneven_tail(world):
    import torch
    from transformers import AutoModelForSequenceClassification

    # 13 examples in batches of 4 -> batches of 4, 4, 4, 1: process 0 runs 8 rows, process 1 runs 5 and pads 3
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        str(REPO / "pipeline" / "evaluate.py"), "--config", str(world.config_path), "--quiet", "eval.batch_size=4",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("macro F1") == 1  # only the main process reports
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
