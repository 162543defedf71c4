"""The multi-label part of an evaluation: chunk logits scored at each label's threshold and averaged per document,
and the report files (report.py) written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.tasks.classification import aggregate
from pipeline.tasks.classification import report as single
from pipeline.tasks.multilabel import report, score


def documents(ids: list[str], logits: np.ndarray, targets: np.ndarray, label_names: list[str]) -> aggregate.Documents:
    """classification's documents (the mean of each document's chunk logits, first-seen order) with (documents, k)
    multi-hot labels; every chunk must carry its document's labels."""
    docs = aggregate.group(ids)
    row = docs.disagreeing(targets)
    if row is not None:
        one, other = (report.names(targets[r], label_names) for r in (row, docs.first[docs.of_row[row]]))
        raise ValueError(f"document '{ids[row]}' has chunks with different labels ({one} and {other}); chunks of "
                         f"one document must share its labels")
    return aggregate.Documents(ids=docs.ids, logits=docs.mean(logits), labels=targets[docs.first],
                               num_chunks=docs.counts)


def predictions(outputs: np.ndarray, docs: list[int], info: dict) -> list[dict]:
    """Task.predictions: each document's labels whose sigmoid of its chunks' mean logits reaches their threshold (the
    model's tuned ones, final/config.json), and every label's probability."""
    names, cut = info["label_names"], score.thresholds(info)
    return [{"labels": report.names(p >= cut, names), "probabilities": dict(zip(names, map(float, p)))}
            for p in score.sigmoid(aggregate.by_document(docs, outputs))]


def _documents(dataset: Any, logits: np.ndarray, label_names: list[str]) -> aggregate.Documents:
    return documents(dataset["id"][:], logits, score.targets(dataset, len(label_names)), label_names)


def evaluate(logits: np.ndarray, dataset: Any, info: dict) -> dict:
    """metrics.json's multi-label part: the label names, each one's threshold (the model's where check_model found
    them, else label.threshold), chunk- and document-level metrics."""
    names, cut = info["label_names"], score.thresholds(info)
    docs = _documents(dataset, logits, names)
    return {"label_names": names, "thresholds": dict(zip(names, cut.tolist())),
            "chunk": score.logit_metrics(logits, score.targets(dataset, len(names)), cut, names),
            "document": score.logit_metrics(docs.logits, docs.labels, cut, names)}


def write_report(tmp: Path, metrics: dict, logits: np.ndarray, dataset: Any, eval_cfg: Any) -> None:
    """Predictions, documents, the per-label table and TensorBoard scalars into the report folder `tmp` (the evaluate
    command's temporary folder, renamed into place after)."""
    names, chars = metrics["label_names"], eval_cfg.snippet_chars
    cut = np.asarray([metrics["thresholds"][n] for n in names])
    docs = _documents(dataset, logits, names)
    examples = report.prediction_rows(dataset["id"][:], score.targets(dataset, len(names)), score.sigmoid(logits), cut,
                                      names, {"chunk": dataset["chunk"][:],
                                              "text": [single.snippet(t, chars) for t in dataset[TEXT][:]]})
    per_document = report.prediction_rows(docs.ids, docs.labels, score.sigmoid(docs.logits), cut, names,
                                          {"chunks": docs.num_chunks.tolist()})
    single.write_jsonl(tmp / "predictions.jsonl", examples)
    single.write_jsonl(tmp / "documents.jsonl", per_document)
    report.write_per_label(tmp / "per_label.csv", metrics)
    report.write_tensorboard(tmp, metrics)
