"""The multilabel label stage, its config checks and its strata (pipeline/tasks/multilabel/label.py)."""

import pickle

import pytest
from datasets import Dataset, DatasetDict, List, Value

from pipeline.checks import load_config
from pipeline.config import ConfigError, LabelConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.tasks.multilabel.label import LIST, label, parse, strata

OK = ["task=multilabel", "train.metric_for_best=micro_f1", "label.names=[]"]  # the default config names tweets' classes


def _dd(train, validation=("a",), test=()):
    def ds(prefix, labels):
        return Dataset.from_dict({"id": [f"{prefix}{k}" for k in range(len(labels))], "text": [f"text {k}" for k in range(len(labels))],
                                  "label": list(labels), "chunk": [0] * len(labels)},
                                 features=None if labels else _features())
    return DatasetDict({"train": ds("i", train), "validation": ds("v", validation), "test": ds("t", test)})


def _features():
    from datasets import Features

    return Features({"id": Value("string"), "text": Value("string"), "label": Value("string"), "chunk": Value("int64")})


def test_parse_cuts_at_the_list_mark_and_the_separator_strips_maps_and_keeps_each_once():
    assert parse(f" b {LIST}a,  c ,,b", ",", {}) == ["b", "a", "c"]
    assert parse("x|y", "|", {"x": "a", "y": "a"}) == ["a"]
    assert parse("a,b", "", {}) == ["a,b"]  # no separator: a list column's marks only
    assert parse("", ",", {}) == [] and parse(" , ", ",", {}) == []


def test_multi_hot_in_names_order_from_list_and_separator_strings(tmp_path):
    res = label(_dd([f"b{LIST}a", "c, a", "", "a,a"], ["c"]), LabelConfig(), StageContext(tmp_path))
    assert res.stats["label_names"] == ["a", "b", "c"]
    assert res.data["train"]["label"] == [[1, 1, 0], [1, 0, 1], [0, 0, 0], [1, 0, 0]]  # the empty row is kept
    assert res.data["validation"]["label"] == [[0, 0, 1]]
    for s in ("train", "validation", "test"):  # the empty test split too
        assert res.data[s].features["label"] == List(Value("int8"))
    assert res.dropped == {}
    assert res.stats["class_counts"] == {"train": {"a": 3, "b": 1, "c": 1}, "validation": {"a": 0, "b": 0, "c": 1},
                                         "test": {"a": 0, "b": 0, "c": 0}}
    assert res.stats["rows_without_labels"] == {"train": 1, "validation": 0, "test": 0}
    assert res.stats["label_cardinality"] == {"train": 1.25, "validation": 1.0, "test": 0.0}
    assert res.stats["classes_without_documents"] == [] and res.stats["threshold"] == 0.5


def test_mapping_and_given_names(tmp_path, capsys):
    cfg = LabelConfig(names=["sports", "politics", "arts"], mapping={"sp": "sports", 7: "politics"}, separator=";")
    res = label(_dd(["sp; 7", "politics", "7;sp;sports"], ["sp"]), cfg, StageContext(tmp_path))
    assert res.data["train"]["label"] == [[1, 1, 0], [0, 1, 0], [1, 1, 0]]
    assert res.stats["classes_without_documents"] == ["arts"]
    assert "label.names lists ['arts'] but no document has that label" in capsys.readouterr().err


def test_unknown_labels_are_an_error_listing_them_with_rows_and_ids(tmp_path):
    with pytest.raises(ValueError, match=r"^labels outside label.names \['a', 'b'\]: 'z' \(2 rows, e.g. ids \['i1', 'i2'\]\), "
                                         r"'y' \(1 rows, e.g. ids \['i2'\]\)\. Map them"):
        label(_dd(["a", "a,z", "y,z,b"]), LabelConfig(names=["a", "b"]), StageContext(tmp_path))


def test_unknown_labels_dropped_from_their_rows_and_counted_rows_kept(tmp_path):
    res = label(_dd(["a", "a,z", "z", "y,z,b"]), LabelConfig(names=["a", "b"], unknown="drop"), StageContext(tmp_path))
    assert res.data["train"]["label"] == [[1, 0], [1, 0], [0, 0], [0, 1]]  # every row kept; "z" alone leaves none
    assert res.dropped == {} and res.stats["unknown_label"] == {"z": 3, "y": 1}
    assert res.stats["rows_without_labels"]["train"] == 1
    assert res.stats["class_counts"]["train"] == {"a": 2, "b": 1}


def test_no_labels_anywhere_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="^no labels found"):
        label(_dd(["", " "], [""]), LabelConfig(), StageContext(tmp_path))


def test_config_checks_are_one_line_each():
    assert load_config(None, OK).task == "multilabel"
    with pytest.raises(ConfigError, match=r"train.metric_for_best: 'accuracy' is not one of 'micro_f1', 'macro_f1', "
                                          r"'subset_accuracy', 'loss' \(the multilabel task's metrics\)"):
        load_config(None, [*OK, "train.metric_for_best=accuracy"])
    with pytest.raises(ConfigError, match=r"label.rules: task=multilabel takes a row's labels from its label column"):
        load_config(None, [*OK, "label.rules=[{pattern: x, label: a}]"])
    with pytest.raises(ConfigError, match=r"label.names repeats 'a'"):
        load_config(None, [*OK, "label.names=[a, b, a]"])
    with pytest.raises(ConfigError, match=r"label.names \['a,b'\] contain label.separator ','"):
        load_config(None, [*OK, "label.names=['a,b', c]"])


def test_strata_is_the_rows_rarest_label_and_pickles():
    cfg = load_config(None, [*OK, "label.mapping={x: c}"])
    rows = Dataset.from_dict({"label": ["a,b", "a", "a,c", "b", f"c{LIST}b", "", "x", "a"]})  # a 4, b 3, c 3 (x is c)
    of = pickle.loads(pickle.dumps(strata(cfg, rows, LocalEngine())))
    assert [of(r) for r in ["a,b", "a", "b,a", "c,a", "", "x, a"]] == ["b", "a", "b", "c", "", "c"]  # b, c tie at 3: by name
    given = strata(load_config(None, [*OK, "label.names=[a, b]", "label.unknown=drop"]), rows, LocalEngine())
    assert given("c,a") == "a" and given("c") == ""  # c is not a label: it does not count
