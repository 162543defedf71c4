"""The three user commands in a row, as real processes, on a slice of the embedded tweets corpus."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "pipeline" / script), "--config", str(ROOT / "configs" / "tiny.yaml"), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_prepare_train_evaluate(tmp_path):
    common = [f"output_dir={tmp_path}", "source.sample=0.03", "train.max_steps=12", "train.save_every=6",
              "train.eval_every=6"]
    prep = _run("prepare.py", "--dedup", "minhash", *common)
    assert "tokenize" in prep.stdout and (tmp_path / "data" / "prepared.json").is_file()
    assert "Saving the dataset" not in prep.stderr and "Map" not in prep.stderr  # library bars only with --verbose
    trained = _run("train.py", *common)
    assert "LOAD REPORT" not in trained.stderr + trained.stdout
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    ev = _run("evaluate.py", "--split", "test", "--quiet", *common)
    assert "accuracy" in ev.stdout
    metrics = json.loads((tmp_path / "run" / "eval" / "test-final" / "metrics.json").read_text())
    report = json.loads((tmp_path / "data" / "report.json").read_text())
    test_rows = sum(1 for _ in open(tmp_path / "run" / "eval" / "test-final" / "predictions.jsonl"))
    assert [r["stage"] for r in report] == ["load", "clean", "dedup", "split", "label", "tokenize"]
    assert metrics["step"] == 12 and metrics["chunk"]["examples"] == test_rows > 0
    assert 0.0 <= metrics["chunk"]["accuracy"] <= 1.0
    again = _run("prepare.py", "--quiet", *common)  # nothing changed: every stage cached
    assert again.stdout.count(" yes ") == 6
