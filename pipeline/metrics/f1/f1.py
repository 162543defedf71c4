"""F1 for single-label classification: macro, micro, or per class (offline `evaluate` module).

scikit-learn's f1_score with zero_division=0 does the arithmetic: a class with no predictions
has precision 0 (not NaN), and a class with neither predictions nor references has F1 0 and
still counts in the macro average when it is listed in `labels`.
"""

import datasets
import evaluate
from sklearn.metrics import f1_score

_DESCRIPTION = "F1 = 2 * precision * recall / (precision + recall), averaged over classes (macro) or pooled (micro)."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
average (str or None): "macro" (mean of per-class F1), "micro" (from pooled counts), or None (one F1 per class).
labels (list of int, optional): the classes, in order; default = sorted ids seen in predictions or references.
Returns: {"f1": float} or, with average=None, {"f1": [float per label]}.
"""


class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, average="macro", labels=None):
        if average not in ("macro", "micro", None):
            raise ValueError(f"f1: average must be 'macro', 'micro' or None, got {average!r}")
        labels = sorted(set(predictions) | set(references)) if labels is None else list(labels)
        if not labels:
            return {"f1": 0.0 if average else []}
        f1 = f1_score(references, predictions, labels=labels, average=average, zero_division=0)
        return {"f1": float(f1) if average else [float(x) for x in f1]}
