import numpy as np
import pytest

from pipeline.evaluation.scores import classification_metrics

NAMES = ["negative", "neutral", "positive", "mixed"]


def test_named_report_by_hand_with_classes_never_predicted_or_absent():
    # class 2 (positive) is never predicted; class 3 (mixed) appears nowhere
    out = classification_metrics([0, 0, 1, 1, 0, 1], [0, 1, 1, 2, 0, 2], NAMES)
    assert out["examples"] == 6 and out["accuracy"] == 0.5 and out["micro_f1"] == pytest.approx(0.5)
    assert out["macro_f1"] == pytest.approx((0.8 + 0.4 + 0.0) / 3)  # over classes present: mixed left out
    assert out["per_class"]["positive"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert out["per_class"]["negative"] == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2})
    assert out["per_class"]["mixed"]["support"] == 0
    assert out["confusion_matrix"] == [[2, 0, 0, 0], [1, 1, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0]]


def test_macro_f1_and_accuracy_match_what_training_ranks_checkpoints_by():
    from pipeline.training.evaluation import metrics_from_confusion

    rng = np.random.default_rng(1)
    refs, preds = rng.integers(0, 3, 200), rng.integers(0, 2, 200)  # class 2 never predicted, class 3 absent
    ours = classification_metrics(preds, refs, NAMES)
    theirs = metrics_from_confusion(np.asarray(ours["confusion_matrix"]), loss_sum=0.0)
    assert ours["macro_f1"] == pytest.approx(theirs["macro_f1"]) and ours["accuracy"] == pytest.approx(theirs["accuracy"])
