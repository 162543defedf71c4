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


# ---------------------------------------------------------------- label.review_file


def _review(tmp_path, text: str, name: str = "review.csv") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_review_file_relabels_and_drops_every_row_of_its_ids_and_is_counted(tmp_path):
    """A chunked document (two rows of id i1) relabelled whole; a dropped id gone from its split; a row that confirms the
    label changes nothing; the counts per class, the manifest's review summary and dropped rows say so (csv and jsonl
    the same)."""
    dd = _dd(["no", "yes", "yes", "no"])
    dd["train"] = Dataset.from_dict({**dd["train"].to_dict(), "id": ["i0", "i1", "i1", "i3"]})
    for name, text in (("review.csv", "id,label\ni1,no\ni3,drop\ni0,no\n"),
                       ("review.jsonl", '{"id": "i1", "label": "no"}\n\n{"id": "i3", "label": "drop"}\n'
                                        '{"id": "i0", "label": "no"}\n')):
        res = label(dd, LabelConfig(names=["no", "yes"], review_file=_review(tmp_path, text, name)), StageContext(tmp_path))
        assert res.data["train"]["id"] == ["i0", "i1", "i1"] and res.data["train"]["label"] == [0, 0, 0]
        assert res.dropped == {"review_drop": 1}
        assert res.stats["class_counts"]["train"] == {"no": 3, "yes": 0}
        review = res.stats["review"]
        assert (review["relabeled"], review["dropped"], review["unchanged"]) == (1, 1, 1)
    plain = label(dd, LabelConfig(names=["no", "yes"]), StageContext(tmp_path))  # nothing changes without a file
    assert plain.data["train"]["label"] == [0, 1, 1, 0] and "review" not in plain.stats and not plain.dropped


@pytest.mark.parametrize("text, error", [
    ("id,label\ni0,no\nnope,yes\n", r"review.csv:3: id 'nope' is no document"),
    ("id,label\ni0,maybe\n", r"review.csv:2: label 'maybe' of id 'i0' is not a class \(no, yes\) nor 'drop'"),
    ("id,label\ni0,\n", r"review.csv:2: a row needs an id and a label"),
    ("id,label\ni0,no\ni0,yes\n", r"review.csv:3: id 'i0' is listed again with another label"),
    ("doc,class\ni0,no\n", r"review.csv: the header has no id, label column"),
])
def test_a_bad_review_row_is_one_line_naming_the_file_and_row(tmp_path, text, error):
    path = _review(tmp_path, text)
    with pytest.raises(ValueError, match=error):
        label(_dd(["no", "yes"]), LabelConfig(names=["no", "yes"], review_file=path), StageContext(tmp_path))


def test_a_missing_review_file_or_a_task_without_labels_to_review_is_refused_before_any_work(tmp_path):
    from pipeline.checks import load_config
    from pipeline.config import ConfigError

    with pytest.raises(ValueError, match=r"label.review_file: .*nothing.csv does not exist"):
        load_config(None, [f"label.review_file={tmp_path / 'nothing.csv'}"])
    path = _review(tmp_path, "id,label\na,b\n")
    with pytest.raises(ConfigError, match=r"label.review_file: task=regression has no single label per row to review"):
        load_config(None, ["task=regression", f"label.review_file={path}", "train.metric_for_best=mse", "label.names=[]"])


def test_the_review_files_bytes_are_in_the_label_stages_fingerprint(tmp_path):
    """An edited review file makes another label stage fingerprint (never a stale cache); the same bytes the same."""
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.runner import data_config_fingerprint

    path = _review(tmp_path, "id,label\ni0,no\n")
    cfg = load_config(None, [f"label.review_file={path}"])
    before = data_config_fingerprint(cfg, tasks.get(cfg.task))
    assert before == data_config_fingerprint(cfg, tasks.get(cfg.task))
    assert before != data_config_fingerprint(load_config(None), tasks.get(cfg.task))
    _review(tmp_path, "id,label\ni0,yes\n")
    assert data_config_fingerprint(cfg, tasks.get(cfg.task)) != before


def test_the_model_card_counts_what_the_review_changed():
    from pipeline.tasks import classification

    stats = {"label_names": ["no", "yes"], "class_counts": {"train": {"no": 3, "yes": 0}},
             "review": {"file": "r.csv", "sha256": "x", "relabeled": 1, "dropped": 2, "unchanged": 3}}
    lines = classification.card_data({"label": {"stats": stats}})
    assert "- **Reviewed labels** (label.review_file r.csv): 1 document(s) relabelled, 2 dropped, 3 confirmed." in lines
    assert not any("Reviewed" in line for line in classification.card_data({"label": {"stats": {**stats, "review": None}}}))
