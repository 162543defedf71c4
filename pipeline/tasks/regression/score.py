"""Regression metrics of one set of predictions: MSE (the training loss), RMSE, MAE, and the Pearson and
Spearman correlations STS-B is reported with. No packaged `evaluate` module computes these (pipeline/metrics
holds classification's); numpy and scipy's ranks do, in float64."""

from __future__ import annotations

import numpy as np


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; 0.0 where it is undefined (fewer than 2 rows, or either side constant: a model that predicts
    one value has no correlation to report, and NaN would break the ranking of checkpoints by it)."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    dx, dy = x - x.mean(), y - y.mean()
    return float(np.clip(dx @ dy / np.sqrt((dx @ dx) * (dy @ dy)), -1.0, 1.0))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the ranks (ties share their mean rank); 0.0 where undefined, as pearson."""
    from scipy.stats import rankdata

    return pearson(rankdata(x), rankdata(y))


def regression_metrics(predictions, targets) -> dict:
    """loss (= mse), mse, rmse, mae, pearson, spearman and examples of predictions against targets."""
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    t = np.asarray(targets, dtype=np.float64).reshape(-1)
    error = p - t
    mse = float(np.mean(error**2)) if len(t) else 0.0
    return {"loss": mse, "mse": mse, "rmse": float(np.sqrt(mse)), "mae": float(np.mean(np.abs(error))) if len(t) else 0.0,
            "pearson": pearson(p, t), "spearman": spearman(p, t), "examples": len(t)}


def score(outputs: np.ndarray, ds, info: dict) -> dict:
    """Task.score: the metrics of (n, 1) predictions against the split's float targets (validation ranks by them)."""
    return regression_metrics(outputs[:, 0], ds["label"][:])
