"""Confusion matrix for single-label classification (offline `evaluate` module)."""

import datasets
import evaluate
from sklearn.metrics import confusion_matrix

_DESCRIPTION = "Counts of (true class, predicted class) pairs; rows are true classes, columns predicted ones."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
labels (list of int, optional): the classes, in order; default = sorted ids seen in predictions or references.
Returns: {"confusion_matrix": k x k list of int lists}; pairs with an id outside `labels` are not counted.
"""


class ConfusionMatrix(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, labels=None):
        labels = sorted(set(predictions) | set(references)) if labels is None else list(labels)
        if not set(labels) & set(references):  # nothing to count (scikit-learn refuses this case)
            return {"confusion_matrix": [[0] * len(labels) for _ in labels]}
        # scikit-learn: rows true, columns predicted, pairs with an id outside `labels` not counted
        return {"confusion_matrix": confusion_matrix(references, predictions, labels=labels).tolist()}
