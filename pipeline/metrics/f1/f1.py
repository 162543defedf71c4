"""F1 for single-label classification: macro, micro, or per class (offline `evaluate` module).

Same conventions as scikit-learn's f1_score with zero_division=0: a class with no predictions
has precision 0 (not NaN), and a class with neither predictions nor references has F1 0 and
still counts in the macro average when it is listed in `labels`.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "F1 = 2 * precision * recall / (precision + recall), averaged over classes (macro) or pooled (micro)."
_INPUTS = """
predictions (list of int): predicted class ids.
references (list of int): true class ids.
average (str or None): "macro" (mean of per-class F1), "micro" (from pooled counts), or None (one F1 per class).
labels (list of int, optional): the classes, in order; default = sorted ids seen in predictions or references.
Returns: {"f1": float} or, with average=None, {"f1": [float per label]}.
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
        cm = _confusion(predictions, references, labels)
        tp, predicted, true = np.diag(cm), cm.sum(axis=0), cm.sum(axis=1)
        if average == "micro":  # pooled counts: 2*TP / (predicted + true)
            den = predicted.sum() + true.sum()
            return {"f1": float(2 * tp.sum() / den) if den > 0 else 0.0}
        f1 = _ratio(2 * tp, predicted + true)  # per class; equals 2PR/(P+R), 0 where undefined
        if average == "macro":
            return {"f1": float(f1.mean()) if len(labels) else 0.0}
        return {"f1": [float(x) for x in f1]}
