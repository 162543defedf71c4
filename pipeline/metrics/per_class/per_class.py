"""Per-class precision, recall, F1 and support (offline `evaluate` module).

scikit-learn's precision_recall_fscore_support with zero_division=0 does the arithmetic: a class
with no predictions gets precision 0, a class with no references recall 0, never NaN.
"""

import datasets
import evaluate
from sklearn.metrics import precision_recall_fscore_support

_DESCRIPTION = "Precision, recall, F1 and support (number of references) of every class."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
labels (list of int, optional): the classes, in order; default = sorted ids seen in predictions or references.
Returns: {"labels": [...], "precision": [...], "recall": [...], "f1": [...], "support": [...]}, one entry per label.
"""


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
        if not labels:
            return {"labels": [], "precision": [], "recall": [], "f1": [], "support": []}
        precision, recall, f1, support = precision_recall_fscore_support(
            references, predictions, labels=labels, average=None, zero_division=0)
        return {
            "labels": [int(x) for x in labels],
            "precision": [float(x) for x in precision],
            "recall": [float(x) for x in recall],
            "f1": [float(x) for x in f1],
            "support": [int(x) for x in support],
        }
