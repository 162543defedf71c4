"""Accuracy: the fraction of predictions equal to the reference (offline `evaluate` module)."""

import datasets
import evaluate
from sklearn.metrics import accuracy_score

_DESCRIPTION = "Accuracy = correct predictions / all predictions, for single-label classification."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
Returns: {"accuracy": float in [0, 1]}; 0.0 for empty inputs.
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        if len(predictions) == 0:
            return {"accuracy": 0.0}
        return {"accuracy": float(accuracy_score(references, predictions))}
