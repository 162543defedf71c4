"""The three user commands in a row, as real processes, on a slice of the embedded tweets corpus; then prepare
again, in this process (its whole output is its table), finding every stage cached."""

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what quiet_libraries sets in a process: an entry point run in this one earlier (another test's) leaves them in
# os.environ, and a process started with them would hide the library bars this test checks are hidden
QUIET = ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "pipeline" / script), "--config", str(ROOT / "configs" / "tiny.yaml"), *args]
    env = {k: v for k, v in os.environ.items() if k not in QUIET}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_prepare_train_evaluate(tmp_path, capsys):
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
    from pipeline.prepare import main

    capsys.readouterr()
    with mock.patch.dict(os.environ):  # what main sets for its process, undone
        assert main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--quiet", *common]) == 0
    assert capsys.readouterr().out.count(" yes ") == 6  # nothing changed: every stage cached
    _check_card(tmp_path, metrics)


def _check_card(out: Path, metrics: dict) -> None:
    """final/README.md parses with the hub library, and its numbers are the manifests' and metrics.json's."""
    from huggingface_hub import ModelCard

    from pipeline import artifacts
    from pipeline.data.runner import stage_manifests

    card = ModelCard.load(out / "run" / "final" / "README.md")
    data = card.data
    assert data.pipeline_tag == "text-classification" and data.library_name == "transformers"
    assert data.tags == ["finetune-pipeline", "classification"] and data.base_model is None  # trained from scratch
    got = {(r.dataset_split, r.metric_type): r.metric_value for r in data.eval_results}  # the hub's model-index parser
    assert got == {("test", "accuracy"): metrics["document"]["accuracy"], ("test", "f1"): metrics["document"]["macro_f1"]}
    man = stage_manifests(Path(json.loads((out / "data" / "prepared.json").read_text())["stage_dir"]))
    dedup, split, load = man["dedup"]["dropped"], man["split"]["stats"]["documents"], man["load"]
    assert f"sha256 `{load['input_fingerprint']}`; {load['rows_in']:,} rows read" in card.text
    assert f"{dedup.get('exact_duplicate', 0):,} exact duplicate" in card.text
    assert f"train {split['train']:,} documents, validation {split['validation']:,} documents, " \
           f"test {split['test']:,} documents" in card.text
    assert f"Test set: {metrics['test_set']}." in card.text and "| steps | 12 (epoch 0) |" in card.text
    assert artifacts.check_files(out / "run" / "final") is None  # the card is no file the manifest must list
