"""Multi-label metrics of one set of logits: each label predicted where sigmoid(logit) reaches its threshold; and the
thresholds tuned on validation."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline import metrics

GRID = np.round(np.arange(0.01, 1.0, 0.01), 2)  # thresholds tuning tries (besides label.threshold)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


def targets(dataset: Any, k: int) -> np.ndarray:
    """A split's multi-hot labels, (rows, k) int8 (also for an empty split)."""
    return np.asarray(dataset["label"][:], dtype=np.int8).reshape(len(dataset), k)


def thresholds(info: dict) -> np.ndarray:
    """Each label's threshold, in label_names order: the model's (info["thresholds"], set by check_model from its
    config.json), else label.threshold for every label (info["threshold"], the label stage's)."""
    names = info["label_names"]
    if info.get("thresholds"):
        return np.asarray([info["thresholds"][n] for n in names], dtype=np.float64)
    return np.full(len(names), info["threshold"], dtype=np.float64)


def binary_cross_entropy(logits: np.ndarray, references: np.ndarray) -> float:
    """Mean BCE (nats) over every row and label, as torch's BCEWithLogitsLoss computes it (without overflow)."""
    if references.size == 0:
        return 0.0
    z, y = logits.astype(np.float64), references.astype(np.float64)
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def label_metrics(predictions: np.ndarray, references: np.ndarray, label_names: list[str]) -> dict:
    """Micro/macro F1, subset accuracy, Hamming loss and per-label precision/recall/F1/support of (n, k) 0/1 arrays.

    Precision, recall and F1 come from the packaged single-label modules, fed one entry per (row, label) cell: the
    label's index where the cell is 1, -1 where 0. Label j's counts are then exactly its binary ones, micro F1 pools
    every label's, and macro F1 is the mean over all k labels (a label neither present nor predicted scores 0), as
    scikit-learn's multi-label f1_score with zero_division=0."""
    k = len(label_names)
    preds = np.where(predictions.astype(bool), np.arange(k), -1).reshape(-1).tolist()
    refs = np.where(references.astype(bool), np.arange(k), -1).reshape(-1).tolist()
    labels, kw = list(range(k)), {"predictions": preds, "references": refs}
    per = metrics.load("per_class").compute(**kw, labels=labels)
    n = len(references)
    return {
        "examples": n,
        "micro_f1": metrics.load("f1").compute(**kw, average="micro", labels=labels)["f1"],
        "macro_f1": metrics.load("f1").compute(**kw, average="macro", labels=labels)["f1"],
        "subset_accuracy": float(np.all(predictions == references, axis=1).mean()) if n else 0.0,
        "hamming_loss": float(np.mean(predictions != references)) if n else 0.0,
        "per_label": {
            name: {"precision": per["precision"][j], "recall": per["recall"][j], "f1": per["f1"][j],
                   "support": per["support"][j]}
            for j, name in enumerate(label_names)
        },
    }


def logit_metrics(logits: np.ndarray, references: np.ndarray, cut: np.ndarray, label_names: list[str]) -> dict:
    """label_metrics of the labels whose sigmoid reaches their threshold in `cut` (k,), and the mean BCE loss."""
    predicted = (sigmoid(logits) >= cut).astype(np.int8)
    return {"loss": binary_cross_entropy(logits, references), **label_metrics(predicted, references, label_names)}


def tune(probabilities: np.ndarray, references: np.ndarray, default: float) -> np.ndarray:
    """Each label's threshold with the best F1 on these rows, of GRID and `default`; of equal F1s the one closest to
    `default`, so a label with no positive row (F1 0 everywhere) keeps `default`. (n, k) -> (k,)."""
    cand = np.union1d(GRID, [default])
    out = np.full(probabilities.shape[1], default, dtype=np.float64)
    for j in range(probabilities.shape[1]):
        y = references[:, j].astype(bool)
        if not y.any():
            continue
        predicted = probabilities[:, j, None] >= cand[None, :]  # (n, candidates)
        tp = (predicted & y[:, None]).sum(axis=0)
        f1 = 2 * tp / (predicted.sum(axis=0) + y.sum())  # 2tp / (2tp + fp + fn); y.any(): never 0 / 0
        best = np.flatnonzero(f1 >= f1.max() - 1e-12)
        out[j] = cand[best[np.argmin(np.abs(cand[best] - default))]]
    return out
