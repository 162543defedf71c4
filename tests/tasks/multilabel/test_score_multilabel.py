"""Multi-label metrics against scikit-learn, the BCE loss, and threshold tuning (pipeline/tasks/multilabel/score.py)."""

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, hamming_loss, precision_recall_fscore_support

from pipeline.tasks.multilabel import TASK
from pipeline.tasks.multilabel.score import binary_cross_entropy, label_metrics, logit_metrics, sigmoid, tune

NAMES = ["a", "b", "c", "d"]
Y = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], dtype=np.int8)  # d: never true
P = np.array([[1, 0, 0, 0], [0, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], dtype=np.int8)


def test_metrics_equal_scikit_learns_on_known_arrays():
    m = label_metrics(P, Y, NAMES)
    # by hand: tp 5 (a 3, b 1, c 1), fp 1 (d), fn 2 (b, c) -> micro F1 10/13; per label F1 a 1, b 2/3, c 2/3, d 0
    assert m["micro_f1"] == pytest.approx(10 / 13) and m["macro_f1"] == pytest.approx((1 + 2 / 3 + 2 / 3 + 0) / 4)
    assert m["subset_accuracy"] == pytest.approx(0.4) and m["hamming_loss"] == pytest.approx(3 / 20)
    assert m["micro_f1"] == pytest.approx(f1_score(Y, P, average="micro", zero_division=0))
    assert m["macro_f1"] == pytest.approx(f1_score(Y, P, average="macro", zero_division=0))
    assert m["subset_accuracy"] == pytest.approx(accuracy_score(Y, P)) and m["hamming_loss"] == pytest.approx(hamming_loss(Y, P))
    precision, recall, f1, support = precision_recall_fscore_support(Y, P, average=None, zero_division=0)
    for j, name in enumerate(NAMES):
        assert m["per_label"][name] == pytest.approx({"precision": precision[j], "recall": recall[j], "f1": f1[j],
                                                      "support": support[j]})
    assert m["per_label"]["b"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert m["examples"] == 5


def test_random_arrays_agree_with_scikit_learn():
    rng = np.random.default_rng(0)
    y, p = (rng.random((200, 7)) < 0.3).astype(np.int8), (rng.random((200, 7)) < 0.3).astype(np.int8)
    m = label_metrics(p, y, list("abcdefg"))
    assert m["micro_f1"] == pytest.approx(f1_score(y, p, average="micro"))
    assert m["macro_f1"] == pytest.approx(f1_score(y, p, average="macro"))
    assert m["subset_accuracy"] == pytest.approx(accuracy_score(y, p))


def test_loss_is_torchs_bce_with_logits_and_labels_are_cut_at_their_thresholds():
    import torch

    logits = np.array([[3.0, -2.0, 0.1, -40.0], [-1.0, 0.5, 0.0, 60.0]], dtype=np.float32)
    y = np.array([[1, 0, 0, 1], [0, 1, 1, 0]], dtype=np.int8)
    want = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(logits), torch.tensor(y, dtype=torch.float32))
    assert binary_cross_entropy(logits, y) == pytest.approx(want.item(), rel=1e-6)
    m = logit_metrics(logits, y, np.array([0.5, 0.5, 0.6, 0.5]), NAMES)  # sigmoid(0.1) 0.525 < 0.6; sigmoid(0) 0.5 < 0.6
    assert m["loss"] == pytest.approx(want.item(), rel=1e-6)
    assert m["per_label"]["c"]["precision"] == 0.0 and m["per_label"]["d"]["precision"] == 0.0
    assert logit_metrics(logits, y, np.full(4, 0.5), NAMES)["per_label"]["c"]["recall"] == 1.0  # 0.5 >= 0.5: predicted


def test_validation_score_is_the_scalars_at_label_threshold_or_the_models():
    logits = np.array([[2.0, -2.0], [0.2, 1.0]])

    class Split(dict):
        def __len__(self):
            return 2

    ds = Split(label=[[1, 0], [0, 1]])
    at_default = TASK.score(logits, ds, {"label_names": ["x", "y"], "threshold": 0.5})
    assert at_default["micro_f1"] == pytest.approx(f1_score([[1, 0], [0, 1]], [[1, 0], [1, 1]], average="micro"))
    assert set(at_default) == {"loss", "examples", "micro_f1", "macro_f1", "subset_accuracy", "hamming_loss"}
    tuned = TASK.score(logits, ds, {"label_names": ["x", "y"], "threshold": 0.5, "thresholds": {"x": 0.6, "y": 0.5}})
    assert tuned["subset_accuracy"] == 1.0  # sigmoid(0.2) 0.55 < 0.6


def test_tuning_finds_the_threshold_between_the_classes_and_keeps_the_default_where_it_cannot():
    probs = np.array([[0.9, 0.1, 0.30, 0.2], [0.72, 0.2, 0.60, 0.3], [0.34, 0.3, 0.10, 0.4], [0.2, 0.4, 0.45, 0.6],
                      [0.1, 0.8, 0.50, 0.1]])
    y = np.array([[1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]], dtype=np.int8)
    out = tune(probs, y, 0.5)
    # a: positives at 0.34 and above, negatives at 0.2 and below: F1 1 on (0.2, 0.34]; 0.34 is the closest to 0.5
    assert out[0] == pytest.approx(0.34)
    # b: F1 1 on (0.4, 0.8], which holds 0.5 itself
    assert out[1] == 0.5
    # c: positives 0.30 and 0.60 among negatives 0.10, 0.45, 0.50: the best F1, 2/3, on (0.1, 0.3] (2 tp, 2 fp) and
    # on (0.5, 0.6] (1 tp, 1 fn); 0.51 is the closest to 0.5
    assert out[2] == pytest.approx(0.51)
    grid = np.round(np.arange(0.01, 1.0, 0.01), 2)
    f1s = [f1_score(y[:, 2], probs[:, 2] >= t, zero_division=0) for t in grid]
    assert max(f1s) == pytest.approx(2 / 3) and f1_score(y[:, 2], probs[:, 2] >= 0.51) == pytest.approx(2 / 3)
    # d: no positive row: label.threshold kept
    assert out[3] == 0.5
    assert tune(probs, y, 0.37).tolist() == [0.34, 0.41, 0.3, 0.37]  # b's best interval (0.4, 0.8]: 0.41


def test_final_config_is_each_labels_tuned_threshold_or_label_threshold():
    from types import SimpleNamespace

    logits = np.log(np.array([[0.9, 0.2], [0.3, 0.7]]) / (1 - np.array([[0.9, 0.2], [0.3, 0.7]])))
    assert sigmoid(logits) == pytest.approx(np.array([[0.9, 0.2], [0.3, 0.7]]))

    class Split(dict):
        def __len__(self):
            return 2

    ds, info = Split(label=[[1, 0], [1, 0]]), {"label_names": ["p", "q"], "threshold": 0.5}
    tuned = TASK.final_config(logits, ds, info, SimpleNamespace(label=SimpleNamespace(threshold=0.5, tune_thresholds=True)))
    assert tuned == {"label_thresholds": {"p": 0.3, "q": 0.5}}  # p: F1 1 up to 0.3; q: no positive
    fixed = TASK.final_config(logits, ds, info, SimpleNamespace(label=SimpleNamespace(threshold=0.4, tune_thresholds=False)))
    assert fixed == {"label_thresholds": {"p": 0.4, "q": 0.4}}
