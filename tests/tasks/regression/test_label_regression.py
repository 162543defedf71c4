"""The regression label stage (pipeline/tasks/regression/label.py) and its strata (strata.py)."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, Value

from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.schema import LabelConfig, SplitConfig
from pipeline.tasks.regression import strata
from pipeline.tasks.regression.label import check_config, label


class Pieces(LocalEngine):
    """The local engine with reduce's partials taken two rows at a time, as Ray's blocks cut them: the stage's
    combine must give the same answer."""

    def reduce(self, ds, fn, combine, columns, **_):
        table = ds.select_columns(columns).with_format("arrow")[:]
        return combine([fn(table.slice(k, 2)) for k in range(0, max(table.num_rows, 1), 2)])


def _dd(train, validation=("1",), test=("2",)):
    def ds(prefix, labels):
        return Dataset.from_dict({"id": [f"{prefix}{k}" for k in range(len(labels))],
                                  "text": [f"text {k}" for k in range(len(labels))],
                                  "label": list(labels), "chunk": [0] * len(labels)})
    return DatasetDict({"train": ds("i", train), "validation": ds("v", validation), "test": ds("t", test)})


@pytest.mark.parametrize("engine", [LocalEngine(), Pieces()], ids=["local", "pieces"])
def test_targets_parsed_to_float32_and_missing_rows_dropped_and_counted(tmp_path, engine):
    res = label(_dd(["0.5", "", " 3 ", "1e-1", ""]), LabelConfig(), StageContext(tmp_path, engine=engine))
    train = res.data["train"]
    assert train.features["label"] == Value("float32")
    assert train["id"] == ["i0", "i2", "i3"]
    np.testing.assert_array_equal(train["label"][:], np.float32([0.5, 3.0, 0.1]))
    assert res.dropped == {"missing_label": 2}
    assert res.stats["scale"] == [0.1, 3.0] and res.stats["scale_from"] == "found"  # the parsed values, not float32's
    values = np.array([0.5, 3.0, 0.1])
    assert res.stats["targets"]["train"] == {"count": 3, "mean": values.mean(), "std": values.std(), "min": 0.1,
                                             "max": 3.0}
    assert res.stats["targets"]["test"] == {"count": 1, "mean": 2.0, "std": 0.0, "min": 2.0, "max": 2.0}


def test_a_label_that_is_not_a_number_is_one_line_naming_the_document_and_value(tmp_path):
    with pytest.raises(ValueError, match=r"^label: document 'i2' has target 'high', not a number finite in float32, "
                                         r"the targets' dtype \(2 such rows in train, e.g. ids \['i2', 'i3'\]\)"):
        label(_dd(["1", "2", "high", "nan"]), LabelConfig(), StageContext(tmp_path))


@pytest.mark.parametrize("big", ["1e39", "-3.5e38", "3.5e38"])
def test_a_target_past_float32s_range_is_refused_never_stored_as_an_infinity(tmp_path, big):
    """1e39 is a finite Python float and inf as float32: prepare stored it as inf, label.unknown=drop kept the row,
    training skipped every update with it and evaluate failed on the plot's limits."""
    with pytest.raises(ValueError, match=rf"^label: document 'i1' has target {re.escape(repr(big))}, not a number "
                                         r"finite in float32"):
        label(_dd(["1", big, "2"]), LabelConfig(), StageContext(tmp_path))
    res = label(_dd(["1", big, "2", "3.4e38"]), LabelConfig(unknown="drop"), StageContext(tmp_path))
    assert res.data["train"]["id"] == ["i0", "i2", "i3"] and res.dropped == {"unknown_label": 1}
    assert np.isfinite(res.data["train"]["label"][:]).all() and res.stats["targets"]["train"]["max"] == 3.4e38
    with pytest.raises(ValueError, match=r"^label.scale: \[0, 1e\+39\] is not \[low, high\] with two numbers finite "
                                         r"in float32"):
        check_config(LabelConfig(scale=[0, 1e39]))


def test_a_target_outside_the_declared_scale_is_an_error_and_the_scale_is_recorded(tmp_path):
    with pytest.raises(ValueError, match=r"^label: document 'v0' has target 5.5, outside label.scale \[0, 5\]"):
        label(_dd(["1", "5"], validation=("5.5",)), LabelConfig(scale=[0, 5]), StageContext(tmp_path))
    res = label(_dd(["0", "5", "2.5"]), LabelConfig(scale=[0, 5]), StageContext(tmp_path))
    assert res.stats["scale"] == [0.0, 5.0] and res.stats["scale_from"] == "label.scale" and not res.dropped


def test_unknown_drop_drops_and_counts_bad_and_outside_rows(tmp_path):
    res = label(_dd(["1", "x", "9", "", "4"]), LabelConfig(scale=[0, 5], unknown="drop"), StageContext(tmp_path))
    assert res.data["train"]["id"] == ["i0", "i4"]
    assert res.dropped == {"missing_label": 1, "unknown_label": 1, "outside_scale": 1}


def test_an_empty_split_keeps_the_float_feature(tmp_path):
    res = label(_dd(["1", "2"], test=()), LabelConfig(), StageContext(tmp_path))
    assert res.data["test"].num_rows == 0 and res.data["test"].features["label"] == Value("float32")
    assert res.stats["targets"]["test"]["count"] == 0


def test_no_targets_at_all_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no targets found"):
        label(_dd(["", ""], validation=(), test=()), LabelConfig(), StageContext(tmp_path))


@pytest.mark.parametrize("engine", [LocalEngine(), Pieces()], ids=["local", "pieces"])
def test_strata_are_balanced_quantile_bins_and_picklable(engine):
    values = np.random.default_rng(0).normal(size=1000)
    ds = Dataset.from_dict({"id": [str(k) for k in range(1000)], "label": [str(float(v)) for v in values]})
    fn = strata.strata(type("Cfg", (), {"split": SplitConfig()})(), ds, engine)
    again = pickle.loads(pickle.dumps(fn))
    bins = [again(str(float(v))) for v in values]
    assert bins == [fn(str(float(v))) for v in values]
    counts = {b: bins.count(b) for b in set(bins)}
    assert sorted(counts) == [f"{k:02d}" for k in range(10)] and set(counts.values()) == {100}
    assert fn(str(values.min())) == "00" and fn(str(values.max())) == "09"  # ends: their bins, not off the edge
    assert fn("") == "" and fn("high") == ""  # the label stage reports these; the split never fails on them


def test_strata_bins_shrink_on_small_data_and_ties_merge():
    assert strata.bins(1000, (0.8, 0.1, 0.1)) == 10
    assert strata.bins(100, (0.8, 0.1, 0.1)) == 5  # each bin gives validation and test 2 rows
    assert strata.bins(10, (0.8, 0.1, 0.1)) == 1 and strata.bins(10, (1.0, 0.0, 0.0)) == 5
    tied = strata.edges(np.array([0.0] * 50 + [1.0] * 50), 10)
    assert tied == (0.0, 1.0)  # targets that occur, ties merged: two bins, one per value
    assert [strata.stratum(x, tied) for x in ("0", "1", "0.5", "-1", "2")] == ["00", "01", "01", "00", "02"]
