"""The packaged metric modules, loaded with `evaluate.load(<local folder>)`, against hand-computed values."""

import numpy as np
import pytest

from pipeline import metrics

# 3 classes; class 2 is never predicted. Confusion (rows true, cols predicted):
#   true 0: [2, 0, 0]   true 1: [1, 1, 0]   true 2: [0, 2, 0]
PREDS = [0, 0, 1, 1, 0, 1]
REFS = [0, 1, 1, 2, 0, 2]


def test_accuracy_by_hand():
    assert metrics.load("accuracy").compute(predictions=PREDS, references=REFS) == {"accuracy": 0.5}
    assert metrics.load("accuracy").compute(predictions=[], references=[]) == {"accuracy": 0.0}


def test_per_class_by_hand_with_a_class_never_predicted():
    out = metrics.load("per_class").compute(predictions=PREDS, references=REFS, labels=[0, 1, 2])
    assert out["labels"] == [0, 1, 2]
    assert out["precision"] == pytest.approx([2 / 3, 1 / 3, 0.0])  # class 2: no predictions -> 0, not NaN
    assert out["recall"] == pytest.approx([1.0, 0.5, 0.0])
    assert out["f1"] == pytest.approx([0.8, 0.4, 0.0])
    assert out["support"] == [2, 2, 2]


def test_f1_macro_micro_and_per_class_by_hand():
    f1 = metrics.load("f1")
    assert f1.compute(predictions=PREDS, references=REFS, average="macro", labels=[0, 1, 2])["f1"] == pytest.approx(0.4)
    assert f1.compute(predictions=PREDS, references=REFS, average="micro", labels=[0, 1, 2])["f1"] == pytest.approx(0.5)
    assert f1.compute(predictions=PREDS, references=REFS, average=None, labels=[0, 1, 2])["f1"] == pytest.approx([0.8, 0.4, 0.0])
    # default labels = ids seen (0, 1, 2); a listed class absent from both sides scores 0 and counts in the macro mean
    assert f1.compute(predictions=PREDS, references=REFS)["f1"] == pytest.approx(0.4)
    assert f1.compute(predictions=PREDS, references=REFS, labels=[0, 1, 2, 3])["f1"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="average"):
        f1.compute(predictions=PREDS, references=REFS, average="weighted")


def test_confusion_matrix_by_hand():
    out = metrics.load("confusion_matrix").compute(predictions=PREDS, references=REFS, labels=[0, 1, 2])
    assert out["confusion_matrix"] == [[2, 0, 0], [1, 1, 0], [0, 2, 0]]


def test_agrees_with_scikit_learn_on_random_labels():
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(0)
    refs, preds = rng.integers(0, 4, 300).tolist(), rng.integers(0, 3, 300).tolist()  # class 3 never predicted
    labels = [0, 1, 2, 3]
    p, r, f, s = precision_recall_fscore_support(refs, preds, labels=labels, zero_division=0)
    out = metrics.load("per_class").compute(predictions=preds, references=refs, labels=labels)
    assert out["precision"] == pytest.approx(p.tolist()) and out["recall"] == pytest.approx(r.tolist())
    assert out["f1"] == pytest.approx(f.tolist()) and out["support"] == s.tolist()
    for avg in ("macro", "micro"):
        ours = metrics.load("f1").compute(predictions=preds, references=refs, average=avg, labels=labels)["f1"]
        assert ours == pytest.approx(f1_score(refs, preds, labels=labels, average=avg, zero_division=0))
    cm = metrics.load("confusion_matrix").compute(predictions=preds, references=refs, labels=labels)["confusion_matrix"]
    assert cm == confusion_matrix(refs, preds, labels=labels).tolist()


def test_modules_load_from_the_package_folder():
    assert metrics.metric_path("f1") == metrics.METRICS_DIR / "f1"
    for name in metrics.NAMES:
        assert (metrics.metric_path(name) / f"{name}.py").is_file()
    with pytest.raises(ValueError, match="available: accuracy"):
        metrics.metric_path("bleu")
