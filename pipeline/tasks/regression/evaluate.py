"""The regression part of an evaluation: chunk predictions scored, averaged per document (as classification
averages a document's chunk logits) and scored again, beside a mean predictor's errors; the report files
(report.py) written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.tasks.classification import aggregate
from pipeline.tasks.classification.report import snippet, write_jsonl
from pipeline.tasks.regression import report, score


@dataclass
class Documents:
    ids: list[str]  # in order of first appearance in the split
    predictions: np.ndarray  # (documents,) mean of the chunks' predictions
    targets: np.ndarray  # (documents,)
    num_chunks: np.ndarray  # (documents,) chunks averaged per document


def aggregate_documents(ids: list[str], predictions: np.ndarray, targets: np.ndarray) -> Documents:
    """Group rows by document id (classification's grouping) and average their predictions; every chunk must carry
    its document's target."""
    targets = np.asarray(targets, dtype=np.float32)
    docs = aggregate.group(ids)
    row = docs.disagreeing(targets)
    if row is not None:
        raise ValueError(f"document '{ids[row]}' has chunks with different targets ({targets[row]:g} and "
                         f"{targets[docs.first[docs.of_row[row]]]:g}); chunks of one document must share its target")
    return Documents(ids=docs.ids, predictions=docs.mean(predictions), targets=targets[docs.first],
                     num_chunks=docs.counts)


def predictions(outputs: np.ndarray, docs: list[int], info: dict) -> list[dict]:
    """Task.predictions: each document's predicted target, the mean of its chunks' (on the target's own scale, as
    trained: label.scale is the range the data had, not a transform)."""
    return [{"prediction": float(v)} for v in aggregate.by_document(docs, outputs[:, :1])[:, 0]]


def _documents(dataset: Any, outputs: np.ndarray) -> Documents:
    return aggregate_documents(dataset["id"][:], outputs[:, 0], dataset["label"][:])


def _baseline(mean: float, targets: np.ndarray) -> dict:
    """The errors of predicting the train split's mean target for every row: what a model must beat."""
    errors = np.asarray(targets, dtype=np.float64) - mean
    return {"mse": float(np.mean(errors**2)), "mae": float(np.mean(np.abs(errors)))} if len(errors) else \
        {"mse": 0.0, "mae": 0.0}


def evaluate(outputs: np.ndarray, dataset: Any, info: dict) -> dict:
    """metrics.json's regression part: the target and its scale, chunk- and document-level metrics, and the
    train mean's errors at both levels."""
    docs = _documents(dataset, outputs)
    targets = np.asarray(dataset["label"][:], dtype=np.float32)
    return {
        "target": info["target"], "scale": info["scale"],
        "chunk": score.regression_metrics(outputs[:, 0], targets),
        "document": score.regression_metrics(docs.predictions, docs.targets),
        "baseline": {"predicts": info["train_mean"], "chunk": _baseline(info["train_mean"], targets),
                     "document": _baseline(info["train_mean"], docs.targets)},
    }


def write_report(tmp: Path, metrics: dict, outputs: np.ndarray, dataset: Any, eval_cfg: Any) -> None:
    """Predictions, documents, scatter plots and TensorBoard scalars into the report folder `tmp` (the
    evaluate command's temporary folder, renamed into place after)."""
    chars, split = eval_cfg.snippet_chars, eval_cfg.split
    docs = _documents(dataset, outputs)
    targets = dataset["label"][:]
    examples = [{"id": i, "chunk": c, "text": snippet(t, chars), "target": round(float(y), 6),
                 "prediction": round(float(p), 6)}
                for i, c, t, y, p in zip(dataset["id"][:], dataset["chunk"][:], dataset[TEXT][:], targets, outputs[:, 0])]
    documents = [{"id": i, "chunks": int(n), "target": round(float(y), 6), "prediction": round(float(p), 6)}
                 for i, n, y, p in zip(docs.ids, docs.num_chunks, docs.targets, docs.predictions)]
    write_jsonl(tmp / "predictions.jsonl", examples)
    write_jsonl(tmp / "documents.jsonl", documents)
    scale = metrics["scale"]
    report.write_scatter(tmp / "scatter.png", targets, outputs[:, 0], scale, f"{split}, chunks", metrics["chunk"])
    if len(docs.ids) and docs.num_chunks.max() > 1:
        report.write_scatter(tmp / "scatter_documents.png", docs.targets, docs.predictions, scale,
                             f"{split}, documents", metrics["document"])
    report.write_tensorboard(tmp, metrics, targets, outputs[:, 0], metrics["step"])
