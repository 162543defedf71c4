import numpy as np
import pytest

from pipeline.tasks.classification.score import classification_metrics

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


def test_logit_metrics_add_the_cross_entropy_of_the_logits():
    import torch

    from pipeline.tasks.classification.score import logit_metrics

    rng = np.random.default_rng(1)
    logits, refs = rng.normal(size=(50, 4)).astype(np.float32) * 5, rng.integers(0, 4, 50)
    out = logit_metrics(logits, refs, NAMES)
    want = torch.nn.functional.cross_entropy(torch.from_numpy(logits).double(), torch.from_numpy(refs)).item()
    assert out["loss"] == pytest.approx(want, rel=1e-12)
    assert out["accuracy"] == classification_metrics(logits.argmax(1), refs, NAMES)["accuracy"]
