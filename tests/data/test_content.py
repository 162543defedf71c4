"""The data's identity by content (pipeline/data/content.py) and the prepared data a run recorded
(pipeline/data/prepared.py is_same_data): rebuilt bytes under a new stage name are the same data."""

import json
import shutil
from pathlib import Path

import datasets
import pytest

from pipeline import artifacts, tasks
from pipeline.data import prepared as prepared_io
from pipeline.data import runner
from pipeline.data.content import content_fingerprint

ROWS = {"id": [f"d{k}" for k in range(50)], "text": [f"text number {k} " * (k % 4 + 1) for k in range(50)],
        "input_ids": [list(range(k % 7 + 1)) for k in range(50)], "label": [k % 3 for k in range(50)]}


def _stage(folder: Path, rows: dict = ROWS, shards: int = 1, side: str = "tok") -> Path:
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)})
    splits.save_to_disk(str(folder / "data"), num_shards={"train": shards, "test": 1})
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "tokenizer.json").write_text(side)
    artifacts.write_json_atomic(folder / artifacts.MANIFEST, artifacts.manifest(stage="tokenize"))
    return folder


def test_the_same_rows_in_other_shards_chunks_or_folders_are_the_same_content(tmp_path):
    one = content_fingerprint(_stage(tmp_path / "a"))
    assert content_fingerprint(_stage(tmp_path / "b", shards=4)) == one  # 4 files, 4 chunks per column
    state = tmp_path / "a" / "data" / "train" / "state.json"  # datasets' bookkeeping: a random _fingerprint
    state.write_text(json.dumps({**json.loads(state.read_text()), "_fingerprint": "0123456789abcdef"}))
    artifacts.write_json_atomic(tmp_path / "a" / artifacts.MANIFEST, {"stage": "tokenize", "seconds": 9})
    (tmp_path / "a" / ".scratch").mkdir()
    (tmp_path / "a" / ".scratch" / "shard.arrow").write_text("scratch")
    assert content_fingerprint(tmp_path / "a") == one


@pytest.mark.parametrize("change", ["a text", "a token", "a label", "the tokenizer", "a row moved"])
def test_any_change_of_a_value_a_row_or_a_side_file_is_other_content(tmp_path, change):
    rows = {k: list(v) for k, v in ROWS.items()}
    side = "tok"
    if change == "a text":
        rows["text"][7] += "!"
    elif change == "a token":
        rows["input_ids"][3] = [*rows["input_ids"][3][:-1], 99]
    elif change == "a label":
        rows["label"][0] = 2
    elif change == "the tokenizer":
        side = "tok2"
    else:  # the same multiset of rows in another order
        rows = {k: v[1:] + v[:1] for k, v in rows.items()}
    assert content_fingerprint(_stage(tmp_path / "b", rows, side=side)) != content_fingerprint(_stage(tmp_path / "a"))


def test_ragged_lists_are_not_confused_by_where_the_values_fall(tmp_path):
    """[[1, 2], [3]] and [[1], [2, 3]] flatten to the same values: the lengths tell them apart."""
    a = {"id": ["x", "y"], "text": ["t", "u"], "input_ids": [[1, 2], [3]], "label": [0, 1]}
    b = {**a, "input_ids": [[1], [2, 3]]}
    assert content_fingerprint(_stage(tmp_path / "a", a)) != content_fingerprint(_stage(tmp_path / "b", b))


def _prepared(stage: Path) -> prepared_io.Prepared:
    return prepared_io.Prepared(splits=None, tokenizer_dir=stage / "tokenizer", info={},
                                fingerprint=content_fingerprint(stage), stage_dir=stage)


def test_a_run_that_recorded_an_older_versions_stage_fingerprint_trained_on_the_same_data(tmp_path):
    stages = tmp_path / "stages"
    now = _prepared(_stage(stages / "5-tokenize-00000000000000aa"))
    shutil.copytree(stages / "5-tokenize-00000000000000aa", stages / "5-tokenize-00000000000000bb")  # an older version's
    _stage(stages / "5-tokenize-00000000000000cc", {**ROWS, "label": [0] * 50})  # other data
    assert prepared_io.is_same_data(now.fingerprint, now)
    assert prepared_io.is_same_data("00000000000000bb", now)  # the older folder holds the same content
    assert not prepared_io.is_same_data("00000000000000cc", now)
    assert not prepared_io.is_same_data("00000000000000dd", now)  # gone: nothing to compare
    assert not prepared_io.is_same_data("../../etc", now) and not prepared_io.is_same_data(None, now)
    (stages / "5-tokenize-00000000000000bb" / artifacts.MANIFEST).unlink()  # incomplete
    assert not prepared_io.is_same_data("00000000000000bb", now)


def test_prepare_records_each_stages_content_and_the_last_one_names_the_data(tmp_path):
    from tests.data.test_runner import _cfg

    cfg = _cfg(tmp_path)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    info = json.loads((cfg.data_dir / runner.PREPARED).read_text())
    stage = Path(info["stage_dir"])
    man = artifacts.read_json(stage / artifacts.MANIFEST)
    assert info["content_fingerprint"] == man["content_fingerprint"] == content_fingerprint(stage)
    assert prepared_io.load_prepared(cfg, tasks.get(cfg.task)).fingerprint == info["content_fingerprint"]
    runner.run(cfg, tasks.get(cfg.task), force=True, progress=False)  # rebuilt: new bytes on disk, the same data
    assert json.loads((cfg.data_dir / runner.PREPARED).read_text())["content_fingerprint"] == info["content_fingerprint"]
