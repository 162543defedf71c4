"""The classification part of an evaluation: the model's classes checked against the data's, chunk logits
scored and averaged per document, and the report files (report.py) written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.tasks.classification import aggregate, report, score


def model_label_names(model: Any) -> list[str]:
    id2label = {int(k): v for k, v in model.config.id2label.items()}
    return [id2label[i] for i in range(len(id2label))]


def check_model(model: Any, info: dict, ckpt: Path) -> None:
    check_labels(model, info["label_names"], ckpt)


def check_labels(model: Any, data_labels: list[str], ckpt: Path) -> None:
    """The classifier's label set (id2label, in id order) must be the prepared data's."""
    names = model_label_names(model)
    if names != list(data_labels):
        raise ValueError(
            f"label mismatch: checkpoint {ckpt} predicts {names} (config id2label) but the prepared data has "
            f"{list(data_labels)}; evaluate with the config the model was trained with"
        )


def _documents(dataset: Any, logits: np.ndarray) -> aggregate.Documents:
    labels = np.asarray(dataset["label"][:], dtype=np.int64)
    return aggregate.aggregate_documents(dataset["id"][:], logits, labels)


def evaluate(logits: np.ndarray, dataset: Any, info: dict) -> dict:
    """metrics.json's classification part: the label names, chunk- and document-level metrics."""
    names = info["label_names"]
    docs = _documents(dataset, logits)
    chunk = score.logit_metrics(logits, np.asarray(dataset["label"][:], dtype=np.int64), names)
    document = score.logit_metrics(docs.logits, docs.labels, names)
    return {"label_names": names, "chunk": chunk, "document": document}


def write_report(tmp: Path, metrics: dict, logits: np.ndarray, dataset: Any, eval_cfg: Any) -> None:
    """Predictions, documents, confusion matrices and TensorBoard scalars into the report folder `tmp`
    (the evaluate command's temporary folder, renamed into place after)."""
    names, chars, step = metrics["label_names"], eval_cfg.snippet_chars, metrics["step"]
    docs = _documents(dataset, logits)
    examples = report.prediction_rows(dataset["id"][:], dataset["label"][:], aggregate.softmax(logits), names, {
        "chunk": dataset["chunk"][:], "text": [report.snippet(t, chars) for t in dataset[TEXT][:]]})
    documents = report.prediction_rows(docs.ids, docs.labels, aggregate.softmax(docs.logits), names, {
        "chunks": docs.num_chunks.tolist()})
    report.write_jsonl(tmp / "predictions.jsonl", examples)
    report.write_jsonl(tmp / "documents.jsonl", documents)
    report.write_confusion(tmp, "confusion_matrix", metrics["chunk"]["confusion_matrix"], names, f"{eval_cfg.split}: chunks")
    if docs.num_chunks.max() > 1:
        report.write_confusion(tmp, "confusion_matrix_documents", metrics["document"]["confusion_matrix"], names,
                               f"{eval_cfg.split}: documents")
    report.write_tensorboard(tmp, metrics, names, step)
