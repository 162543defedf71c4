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


@dataclass
class Groups:
    """A split's rows grouped by document id, the documents in order of first appearance. Every task that scores
    chunked documents groups with it (classification's logits, multilabel's, regression's predictions)."""

    ids: list[str]
    first: np.ndarray  # (documents,) each document's first row
    of_row: np.ndarray  # (rows,) each row's document
    counts: np.ndarray  # (documents,) rows per document

    def mean(self, values: np.ndarray) -> np.ndarray:
        """(documents, ...) float32: the mean of each document's rows of `values` (summed in float64)."""
        values = np.asarray(values)
        sums = np.zeros((len(self.ids), *values.shape[1:]), dtype=np.float64)
        np.add.at(sums, self.of_row, values)
        return (sums / self.counts.reshape(-1, *[1] * (values.ndim - 1))).astype(np.float32)

    def disagreeing(self, labels: np.ndarray) -> int | None:
        """The first row whose label (a row of `labels`) is not its document's first row's, or None."""
        differ = labels != labels[self.first][self.of_row]
        differ = differ.reshape(len(differ), -1).any(axis=1)
        return int(np.argmax(differ)) if differ.any() else None


def group(ids: list[str]) -> Groups:
    ids_arr = np.asarray(ids, dtype=object)
    uniq, first, inverse = np.unique(ids_arr, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # np.unique sorts ids; restore first-seen order
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    of_row = rank[inverse.reshape(-1)]
    return Groups(ids=[str(x) for x in uniq[order]], first=first[order], of_row=of_row,
                  counts=np.bincount(of_row, minlength=len(order)))


def aggregate_documents(ids: list[str], logits: np.ndarray, labels: np.ndarray) -> Documents:
    """Group rows by document id and average their logits; every chunk must carry its document's label."""
    labels = np.asarray(labels, dtype=np.int64)
    docs = group(ids)
    row = docs.disagreeing(labels)
    if row is not None:
        raise ValueError(
            f"document '{ids[row]}' has chunks with different labels ({labels[row]} and "
            f"{labels[docs.first[docs.of_row[row]]]}); chunks of one document must share its label"
        )
    return Documents(ids=docs.ids, logits=docs.mean(logits), labels=labels[docs.first], num_chunks=docs.counts)


def by_document(docs: list[int], outputs: np.ndarray) -> np.ndarray:
    """(documents, k): the mean of each document's rows of `outputs`, documents in first-seen order of `docs`."""
    return group(list(docs)).mean(outputs)


def predictions(outputs: np.ndarray, docs: list[int], info: dict) -> list[dict]:
    """Task.predictions: each document's label and class probabilities, the softmax of its chunks' mean logits."""
    names = info["label_names"]
    return [{"label": names[int(p.argmax())], "probabilities": dict(zip(names, map(float, p)))}
            for p in softmax(by_document(docs, outputs))]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise probabilities of (n, classes) logits, computed stably."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
