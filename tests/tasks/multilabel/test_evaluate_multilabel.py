"""The multi-label evaluation: documents, metrics.json's part, the report files and the table
(pipeline/tasks/multilabel/evaluate.py, report.py)."""

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
from datasets import Dataset, Features, List, Value

from pipeline.tasks.multilabel import TASK
from pipeline.tasks.multilabel.evaluate import documents

NAMES = ["arts", "politics", "sports"]
# document "d1" in three chunks (arts + sports), "d2" one (politics), "d3" two (none of the labels)
IDS = ["d1", "d2", "d1", "d3", "d1", "d3"]
LABELS = [[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0], [1, 0, 1], [0, 0, 0]]
LOGITS = np.array([[2.0, -1.0, -3.0], [-2.0, 1.0, 0.0], [1.0, -1.0, 1.0], [-1.0, -1.0, 0.5], [0.0, -4.0, 5.0],
                   [-3.0, 0.0, -2.5]], dtype=np.float32)


def _split():
    features = Features({"id": Value("string"), "chunk": Value("int64"), "text": Value("string"),
                         "label": List(Value("int8"))})
    return Dataset.from_dict({"id": IDS, "chunk": [0, 0, 1, 0, 2, 1], "text": [f"chunk text number {k}" for k in range(6)],
                              "label": LABELS}, features=features)


def test_documents_average_their_chunks_logits_and_keep_their_labels():
    docs = documents(IDS, LOGITS, np.array(LABELS, dtype=np.int8), NAMES)
    assert docs.ids == ["d1", "d2", "d3"] and docs.num_chunks.tolist() == [3, 1, 2]
    np.testing.assert_allclose(docs.logits, [[1.0, -2.0, 1.0], [-2.0, 1.0, 0.0], [-2.0, -0.5, -1.0]], rtol=1e-6)
    assert docs.labels.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match=r"^document 'd1' has chunks with different labels \(\['arts'\] and \['arts', 'sports'\]\)"):
        documents(IDS, LOGITS, np.array([LABELS[0], LABELS[1], [1, 0, 0], *LABELS[3:]], dtype=np.int8), NAMES)


def test_metrics_json_part_at_label_threshold_and_at_the_models():
    info = {"label_names": NAMES, "threshold": 0.5}
    m = TASK.evaluate(LOGITS, _split(), info)
    assert m["label_names"] == NAMES and m["thresholds"] == {"arts": 0.5, "politics": 0.5, "sports": 0.5}
    assert m["chunk"]["examples"] == 6 and m["document"]["examples"] == 3
    # documents at 0.5 (logit >= 0): d1 arts+sports (right), d2 politics+sports (sports wrong), d3 none (right)
    assert m["document"]["subset_accuracy"] == pytest.approx(2 / 3)
    assert m["document"]["per_label"]["sports"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1}
    assert m["document"]["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 1))
    tuned = TASK.evaluate(LOGITS, _split(), {**info, "thresholds": {"arts": 0.5, "politics": 0.5, "sports": 0.6}})
    assert tuned["thresholds"]["sports"] == 0.6 and tuned["document"]["subset_accuracy"] == 1.0  # d2's 0.5 < 0.6
    assert TASK.card_metrics(tuned) == [("f1", "Micro F1", 1.0), ("f1", "Macro F1", 1.0), ("accuracy", "Subset accuracy", 1.0)]


def test_report_files_and_the_table(tmp_path):
    m = {**TASK.evaluate(LOGITS, _split(), {"label_names": NAMES, "threshold": 0.5}), "split": "test", "step": 7,
         "checkpoint": "final", "checkpoint_path": "run/final", "examples_per_second": 12.0, "processes": 1,
         "output_dir": "run/eval/test-final"}
    TASK.write_report(tmp_path, m, LOGITS, _split(), SimpleNamespace(snippet_chars=10, split="test"))
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 6 and rows[1] == {"id": "d2", "chunk": 0, "text": "chunk text…", "labels": ["politics"],
                                          "predicted": ["politics", "sports"],
                                          "probabilities": {"arts": 0.119203, "politics": 0.731059, "sports": 0.5}}
    docs = [json.loads(line) for line in (tmp_path / "documents.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(d["id"], d["chunks"], d["labels"], d["predicted"]) for d in docs] == [
        ("d1", 3, ["arts", "sports"], ["arts", "sports"]), ("d2", 1, ["politics"], ["politics", "sports"]), ("d3", 2, [], [])]
    with open(tmp_path / "per_label.csv", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert [(r["level"], r["label"]) for r in table] == [(lv, n) for lv in ("chunk", "document") for n in NAMES]
    assert table[5] == {"level": "document", "label": "sports", "threshold": "0.5", "precision": "0.5", "recall": "1.0",
                        "f1": str(m["document"]["per_label"]["sports"]["f1"]), "support": "1"}
    assert any((tmp_path / "tensorboard").iterdir())
    text = TASK.summary(m)
    assert text.splitlines()[0] == "split 'test', checkpoint 'final' (run/final)"
    assert "6 examples (chunks) in 3 documents" in text and "subset accuracy" in text and "micro F1" in text
    assert any(line.split() == ["sports", "0.5000", "1.0000", "0.6667", "1", "0.500"] for line in text.splitlines())
    assert text.splitlines()[-1] == "outputs: run/eval/test-final"
