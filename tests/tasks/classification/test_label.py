import pytest
from datasets import Dataset, DatasetDict

from pipeline.config import LabelConfig
from pipeline.data.engines.base import StageContext
from pipeline.tasks.classification.label import label


def _dd(labels, texts=None):
    texts = texts or [f"text {k}" for k in range(len(labels))]
    def ds(prefix, rows):
        return Dataset.from_dict({"id": [f"{prefix}{k}" for k in rows], "text": [texts[k] for k in rows],
                                  "label": [labels[k] for k in rows], "chunk": [0] * len(rows)})
    return DatasetDict({"train": ds("i", range(len(labels))), "validation": ds("v", [0]), "test": ds("t", [0])})


def test_mapping_to_class_ids(tmp_path):
    res = label(_dd(["pos", "neg", "1", "pos"]), LabelConfig(names=["negative", "positive"], mapping={"pos": "positive", "neg": "negative", 1: "positive"}), StageContext(tmp_path))
    assert res.data["train"]["label"] == [1, 0, 1, 1]
    assert res.data["train"].features["label"].names == ["negative", "positive"]
    assert res.stats["label_names"] == ["negative", "positive"]


def test_names_derived_sorted_when_not_given(tmp_path):
    res = label(_dd(["b", "a", "c"]), LabelConfig(), StageContext(tmp_path))
    assert res.stats["label_names"] == ["a", "b", "c"] and res.data["train"]["label"] == [1, 0, 2]


def test_unknown_labels_error_lists_values_counts_and_ids(tmp_path):
    with pytest.raises(ValueError, match=r"'maybe' \(2 rows, e.g. ids \['i1', 'i3'\]\)"):
        label(_dd(["yes", "maybe", "no", "maybe"]), LabelConfig(names=["no", "yes"]), StageContext(tmp_path))


def test_unknown_labels_dropped_and_counted(tmp_path):
    res = label(_dd(["yes", "maybe", "no", "maybe", ""]), LabelConfig(names=["no", "yes"], unknown="drop"), StageContext(tmp_path))
    assert res.data["train"]["label"] == [1, 0]
    assert res.dropped == {"unknown_label": 2, "missing_label": 1}


def test_rules_label_unlabelled_text_in_order(tmp_path):
    texts = ["I love it", "I hate it", "love and hate", "meh"]
    rules = [{"pattern": r"\bhate\b", "label": "neg"}, {"pattern": "love", "label": "pos"}]
    res = label(_dd([""] * 4, texts), LabelConfig(names=["neg", "pos"], rules=rules, unknown="drop"), StageContext(tmp_path))
    assert res.data["train"]["label"] == [1, 0, 0]
    assert res.dropped == {"missing_label": 1}


def test_bad_rule_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"label.rules\[0\].pattern '\(' is not a valid regex"):
        label(_dd([""]), LabelConfig(names=["a"], rules=[{"pattern": "(", "label": "a"}]), StageContext(tmp_path))
