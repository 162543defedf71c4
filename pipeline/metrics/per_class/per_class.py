"""Per-class precision, recall, F1 and support (offline `evaluate` module).

Conventions of scikit-learn's precision_recall_fscore_support with zero_division=0: a class
with no predictions gets precision 0, a class with no references recall 0, never NaN.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Precision, recall, F1 and support (number of references) of every class."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
labels (list of int, optional): the classes, in order; default = sorted ids seen in predictions or references.
Returns: {"labels": [...], "precision": [...], "recall": [...], "f1": [...], "support": [...]}, one entry per label.
"""


def _confusion(predictions, references, labels):
    """(k, k) counts, rows = true class, columns = predicted class; ids outside `labels` are ignored."""
    index = {label: i for i, label in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for p, r in zip(predictions, references):
        if p in index and r in index:
            cm[index[r], index[p]] += 1
    return cm


def _ratio(num, den):
    return np.divide(num, den, out=np.zeros(len(num), dtype=np.float64), where=den > 0)


class PerClass(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, labels=None):
        labels = sorted(set(predictions) | set(references)) if labels is None else list(labels)
        cm = _confusion(predictions, references, labels)
        tp, predicted, true = np.diag(cm), cm.sum(axis=0), cm.sum(axis=1)
        return {
            "labels": [int(x) for x in labels],
            "precision": [float(x) for x in _ratio(tp, predicted)],
            "recall": [float(x) for x in _ratio(tp, true)],
            "f1": [float(x) for x in _ratio(2 * tp, predicted + true)],
            "support": [int(x) for x in true],
        }
