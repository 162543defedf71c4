"""Classification metrics of one set of predictions, through the packaged `evaluate` modules."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline import metrics


def classification_metrics(predictions: Any, references: Any, label_names: list[str]) -> dict:
    """Accuracy, macro/micro F1, per-class precision/recall/F1/support and the confusion matrix.

    Every class in `label_names` gets a per-class row, including one the model never predicts
    (precision 0) or one absent from the references (support 0). Macro F1 averages over the
    classes present in references or predictions (scikit-learn's default, and the definition
    training uses to rank checkpoints), so a class missing from a small split does not count as 0.
    """
    preds = [int(x) for x in np.asarray(predictions).reshape(-1)]
    refs = [int(x) for x in np.asarray(references).reshape(-1)]
    labels = list(range(len(label_names)))
    kw = {"predictions": preds, "references": refs}
    per = metrics.load("per_class").compute(**kw, labels=labels)
    return {
        "examples": len(refs),
        "accuracy": metrics.load("accuracy").compute(**kw)["accuracy"],
        "macro_f1": metrics.load("f1").compute(**kw, average="macro")["f1"],
        "micro_f1": metrics.load("f1").compute(**kw, average="micro", labels=labels)["f1"],
        "per_class": {
            name: {"precision": per["precision"][i], "recall": per["recall"][i], "f1": per["f1"][i], "support": per["support"][i]}
            for i, name in enumerate(label_names)
        },
        "confusion_matrix": metrics.load("confusion_matrix").compute(**kw, labels=labels)["confusion_matrix"],
    }


def cross_entropy(logits: np.ndarray, references: np.ndarray) -> float:
    """Mean negative log-likelihood (nats) of the references under softmax(logits), (n, classes) -> float."""
    if len(references) == 0:
        return 0.0
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)  # log-sum-exp without overflow
    log_norm = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(log_norm - z[np.arange(len(references)), references]))


def logit_metrics(logits: np.ndarray, references: Any, label_names: list[str]) -> dict:
    """classification_metrics of the argmax prediction, and the cross-entropy loss of the logits."""
    refs = np.asarray(references, dtype=np.int64)
    return {"loss": cross_entropy(logits, refs), **classification_metrics(logits.argmax(axis=1), refs, label_names)}
