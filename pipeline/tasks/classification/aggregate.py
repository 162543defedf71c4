"""From chunk predictions to document predictions: the mean of a document's chunk logits.

A long document cut into chunks by the split stage has one row per chunk, all with the
document's `id` and label. Averaging logits (not votes) lets a confident chunk outweigh
several unsure ones, and gives every document exactly one prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Documents:
    ids: list[str]  # in order of first appearance in the split
    logits: np.ndarray  # (documents, num_labels): mean of the chunks' logits
    labels: np.ndarray  # (documents,) int class ids
    num_chunks: np.ndarray  # (documents,) chunks averaged per document


def aggregate_documents(ids: list[str], logits: np.ndarray, labels: np.ndarray) -> Documents:
    """Group rows by document id and average their logits; every chunk must carry its document's label."""
    ids_arr = np.asarray(ids, dtype=object)
    labels = np.asarray(labels, dtype=np.int64)
    uniq, first, inverse = np.unique(ids_arr, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.zeros((len(uniq), logits.shape[1]), dtype=np.float64)
    np.add.at(sums, inverse, logits)
    counts = np.bincount(inverse, minlength=len(uniq))
    doc_labels = labels[first]
    disagree = np.flatnonzero(labels != doc_labels[inverse])
    if len(disagree):
        row = int(disagree[0])
        raise ValueError(
            f"document '{ids_arr[row]}' has chunks with different labels ({labels[row]} and "
            f"{doc_labels[inverse[row]]}); chunks of one document must share its label"
        )
    order = np.argsort(first, kind="stable")  # np.unique sorts ids; restore first-seen order
    return Documents(
        ids=[str(x) for x in uniq[order]],
        logits=(sums / counts[:, None]).astype(np.float32)[order],
        labels=doc_labels[order],
        num_chunks=counts[order],
    )


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise probabilities of (n, classes) logits, computed stably."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
