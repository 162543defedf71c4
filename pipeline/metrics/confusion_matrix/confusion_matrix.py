"""Confusion matrix for single-label classification (offline `evaluate` module)."""

import datasets
import evaluate
import numpy as np

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
        index = {label: i for i, label in enumerate(labels)}
        cm = np.zeros((len(labels), len(labels)), dtype=np.int64)
        for p, r in zip(predictions, references):
            if p in index and r in index:
                cm[index[r], index[p]] += 1
        return {"confusion_matrix": cm.tolist()}
