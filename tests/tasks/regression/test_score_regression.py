"""Regression metrics (pipeline/tasks/regression/score.py) against scipy and scikit-learn, and the document
average (evaluate.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import mean_absolute_error, mean_squared_error

from pipeline.tasks.regression.evaluate import aggregate_documents
from pipeline.tasks.regression.score import regression_metrics, score


def test_known_answers():
    out = regression_metrics([1.0, 2.0, 3.0, 5.0], [1.0, 3.0, 2.0, 4.0])
    assert out["mse"] == out["loss"] == 0.75 and out["mae"] == 0.75 and out["rmse"] == pytest.approx(0.75**0.5)
    assert out["spearman"] == pytest.approx(0.8) and out["examples"] == 4  # ranks 1 2 3 4 against 1 3 2 4
    assert out["pearson"] == pytest.approx(5.5 / np.sqrt(8.75 * 5))  # centred: (-1.75 -.75 .25 2.25), (-1.5 .5 -.5 1.5)


def test_against_scipy_and_sklearn_with_ties():
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 6, 200).astype(np.float64)  # STS-B-like: many ties
    predictions = (targets + rng.normal(scale=1.5, size=200)).astype(np.float32)
    out = regression_metrics(predictions, targets)
    assert out["pearson"] == pytest.approx(pearsonr(predictions.astype(np.float64), targets).statistic, rel=1e-12)
    assert out["spearman"] == pytest.approx(spearmanr(predictions, targets).statistic, rel=1e-12)
    assert out["mse"] == pytest.approx(mean_squared_error(targets, predictions), rel=1e-12)
    assert out["mae"] == pytest.approx(mean_absolute_error(targets, predictions), rel=1e-12)


def test_constant_predictions_score_zero_correlation_never_nan():
    out = regression_metrics([0.3] * 5, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert out["pearson"] == 0.0 and out["spearman"] == 0.0
    assert out["mse"] == pytest.approx(np.mean((np.arange(1, 6) - 0.3) ** 2))
    assert regression_metrics([1.0, 2.0], [3.0, 3.0])["pearson"] == 0.0  # constant targets
    one, none = regression_metrics([1.0], [2.0]), regression_metrics([], [])
    assert one["pearson"] == 0.0 and one["mse"] == 1.0
    assert none == {"loss": 0.0, "mse": 0.0, "rmse": 0.0, "mae": 0.0, "pearson": 0.0, "spearman": 0.0, "examples": 0}


def test_score_reads_the_outputs_column_and_the_split_targets():
    from datasets import Dataset

    ds = Dataset.from_dict({"label": np.float32([1.0, 2.0, 4.0])})
    out = score(np.float32([[1.5], [2.0], [3.0]]), ds, {})
    assert out["mse"] == pytest.approx((0.25 + 1.0) / 3) and out["examples"] == 3
    assert all(isinstance(v, (int, float)) for v in out.values())  # scalars only: validation logs them all


def test_document_prediction_is_the_mean_of_its_chunks_in_first_seen_order():
    docs = aggregate_documents(["z", "a", "z", "z"], np.float32([1.0, 4.0, 2.0, 6.0]), np.float32([3, 1, 3, 3]))
    assert docs.ids == ["z", "a"] and docs.num_chunks.tolist() == [3, 1]
    np.testing.assert_allclose(docs.predictions, [3.0, 4.0])
    np.testing.assert_array_equal(docs.targets, [3.0, 1.0])
    with pytest.raises(ValueError, match=r"document 'd' has chunks with different targets \(2 and 1\)"):
        aggregate_documents(["d", "d"], np.zeros(2), np.float32([1, 2]))
