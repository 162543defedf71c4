import numpy as np
import pytest

from pipeline.tasks.classification.aggregate import aggregate_documents, softmax


def test_planted_document_mean_of_chunk_logits():
    # document "a" has 3 chunks: two weakly class 1, one strongly class 0 -> the mean says class 0,
    # although most chunks vote 1. "b" and "c" are single-chunk documents.
    ids = ["a", "b", "a", "c", "a"]
    logits = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [6.0, 0.0]], dtype=np.float32)
    labels = np.array([0, 0, 0, 1, 0])
    docs = aggregate_documents(ids, logits, labels)
    assert docs.ids == ["a", "b", "c"]  # first-seen order, not sorted
    np.testing.assert_allclose(docs.logits, [[2.0, 2 / 3], [2.0, 0.0], [0.0, 3.0]], rtol=1e-6)
    assert docs.labels.tolist() == [0, 0, 1]
    assert docs.num_chunks.tolist() == [3, 1, 1]
    assert docs.logits.argmax(axis=1).tolist() == [0, 0, 1]
    assert (logits.argmax(axis=1) == labels).sum() == 3  # chunk level: 3 of 5 right; documents: 3 of 3


def test_first_seen_order_is_kept_when_ids_do_not_sort():
    docs = aggregate_documents(["z", "m", "z"], np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), np.array([1, 0, 1]))
    assert docs.ids == ["z", "m"]
    np.testing.assert_allclose(docs.logits, [[2.0, 0.0], [0.0, 1.0]])
    assert docs.labels.tolist() == [1, 0]


def test_chunks_with_different_labels_are_an_error_naming_the_document():
    with pytest.raises(ValueError, match="document 'doc7'"):
        aggregate_documents(["doc7", "doc7"], np.zeros((2, 2)), np.array([0, 1]))


def test_softmax_rows_sum_to_one_and_survive_large_logits():
    p = softmax(np.array([[1000.0, 1000.0, 0.0], [0.0, np.log(3.0), 0.0]]))
    np.testing.assert_allclose(p.sum(axis=1), [1.0, 1.0])
    np.testing.assert_allclose(p[0], [0.5, 0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(p[1], [0.2, 0.6, 0.2])
