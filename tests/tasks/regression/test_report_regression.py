"""What a regression evaluation returns, writes and prints (pipeline/tasks/regression/evaluate.py, report.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from datasets import Dataset

from pipeline.checks import load_config
from pipeline.tasks.regression import TASK

INFO = {"target": "similarity", "scale": [0.0, 5.0], "train_mean": 2.0}


def _split():
    """Document d0 in two chunks, d1 and d2 whole."""
    ds = Dataset.from_dict({"id": ["d0", "d0", "d1", "d2"], "chunk": [0, 1, 0, 0],
                            "text": ["first half of a long text", "second half", "short", "x" * 300],
                            "label": np.float32([4.0, 4.0, 1.0, 2.5])})
    return ds, np.float32([[3.0], [4.0], [1.5], [2.0]])


def test_evaluate_scores_chunks_documents_and_the_mean_baseline():
    ds, outputs = _split()
    out = TASK.evaluate(outputs, ds, INFO)
    assert out["target"] == "similarity" and out["scale"] == [0.0, 5.0]
    assert out["chunk"]["examples"] == 4 and out["chunk"]["mse"] == pytest.approx((1 + 0 + 0.25 + 0.25) / 4)
    assert out["document"]["examples"] == 3 and out["document"]["mse"] == pytest.approx((0.25 + 0.25 + 0.25) / 3)
    assert out["baseline"]["document"] == pytest.approx({"mse": (4 + 1 + 0.25) / 3, "mae": (2 + 1 + 0.5) / 3})
    assert out["baseline"]["predicts"] == 2.0


def test_report_files_and_summary(tmp_path):
    ds, outputs = _split()
    cfg = load_config(None, ["task=regression", "train.metric_for_best=pearson", "label.names=[]",
                             "eval.snippet_chars=10"])
    metrics = {"split": "test", "checkpoint": "final", "checkpoint_path": "/run/final", "step": 7,
               **TASK.evaluate(outputs, ds, INFO), "examples_per_second": 12.5, "processes": 1,
               "output_dir": str(tmp_path)}
    TASK.write_report(tmp_path, metrics, outputs, ds, cfg.eval)
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert rows[0] == {"id": "d0", "chunk": 0, "text": "first half…", "target": 4.0, "prediction": 3.0}
    assert len(rows) == 4
    docs = [json.loads(line) for line in (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert docs[0] == {"id": "d0", "chunks": 2, "target": 4.0, "prediction": 3.5} and len(docs) == 3
    for name in ("scatter.png", "scatter_documents.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((tmp_path / "tensorboard").iterdir())
    table = TASK.summary(metrics)
    assert "4 examples (chunks) in 3 documents" in table and "target 'similarity', scale [0, 5]" in table
    doc_mse = metrics["document"]["mse"]
    assert f"{'MSE':<10} {metrics['chunk']['mse']:>8.4f} {doc_mse:>10.4f}" in table
    assert table.splitlines()[-1] == f"outputs: {tmp_path}"


def test_no_document_scatter_when_no_document_is_chunked(tmp_path):
    ds, outputs = _split()
    ds, outputs = ds.select([2, 3]), outputs[2:]
    cfg = load_config(None, ["task=regression", "train.metric_for_best=pearson", "label.names=[]"])
    metrics = {"split": "validation", "step": 1, **TASK.evaluate(outputs, ds, INFO)}
    TASK.write_report(tmp_path, metrics, outputs, ds, cfg.eval)
    assert (tmp_path / "scatter.png").is_file() and not (tmp_path / "scatter_documents.png").exists()
