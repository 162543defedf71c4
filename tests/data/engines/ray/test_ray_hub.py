"""A hub dataset loaded on Ray (pipeline/data/engines/ray/load.py, hub_io.hub_parts): load_dataset runs on the
driver, the rows are read by tasks from the Arrow files it wrote into the HF datasets cache, and the
answer is the local engine's; offline, from a local folder that load_dataset reads as a dataset
with a train and a test split."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.config import SourceConfig
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ray import load as ray_load
from pipeline.data.io import formats, parts
from pipeline.data.io import hub as hub_io
from pipeline.data.stages import load
from tests.data.engines.ray.test_ray_load import _engine, _load


@pytest.fixture
def hub(tmp_path, monkeypatch) -> SourceConfig:
    """<tmp>/hub/{train,test}.parquet with a ClassLabel column (-1: unlabelled) and texts that repeat
    (content ids -2 across splits), empty texts; the HF cache under <tmp>/cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    (tmp_path / "hub").mkdir()
    for split, n in (("train", 45), ("test", 12)):
        texts = [f"doc {k % 13}" if k % 7 else "  " for k in range(n)]
        labels = [k % 2 if k % 5 else -1 for k in range(n)]
        datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features).to_parquet(
            str(tmp_path / "hub" / f"{split}.parquet"))
    return SourceConfig(format="hub", path=str(tmp_path / "hub"))


def _same(cfg: SourceConfig, blocks: int, tmp_path: Path) -> tuple:
    local = _load(cfg, LocalEngine(), tmp_path)
    assert _load(cfg, _engine(blocks), tmp_path) == local
    return local


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 2, 7])
def test_a_hub_dataset_read_by_tasks_equals_the_local_read(tmp_path, ray_cluster, hub, blocks):
    _, rows, _, dropped, stats = _same(hub, blocks, tmp_path)
    assert stats["rows_read"] == 57 and dropped == {"empty": 9} and len(rows) == 48
    assert [r["source_split"] for r in rows].count("test") == 10
    assert {r["label"] for r in rows} == {"neg", "pos", ""}
    assert rows[0]["id"] + "-4" == next(r["id"] for r in rows if r["source_split"] == "test" and r["text"] == "doc 1")
    picked = _same(SourceConfig(format="hub", path=hub.path, hub_splits=["test", "train[5:30]"], max_rows=30,
                                sample=0.7), blocks, tmp_path)
    assert picked[1][0]["source_split"] == "test" and 0 < len(picked[1]) < 30 and picked[4]["rows_read"] == 37


@pytest.mark.slow
def test_the_hub_parts_are_row_ranges_of_the_cache_files(tmp_path, ray_cluster, hub):
    pieces = formats.plan_parts(Path(hub.path), hub, 7)
    assert [(p.rows[0], p.rows[3], p.rows[4]) for p in pieces] == [
        ("train", 0, 7), ("train", 7, 15), ("train", 15, 22), ("train", 22, 30), ("train", 30, 37),
        ("train", 37, 45), ("test", 0, 12)]
    assert all(Path(f).is_relative_to(tmp_path / "cache") for p in pieces for f in p.rows[1])


@pytest.mark.slow
def test_the_driver_never_reads_the_hub_datasets_rows(tmp_path, ray_cluster, hub, monkeypatch):
    expected = _load(hub, LocalEngine(), tmp_path)

    def not_here(*_, **__):
        raise AssertionError("the driver read the hub dataset's rows")

    with monkeypatch.context() as trap:  # in this process only: the tasks run in Ray's workers
        for module, name in ((hub_io, "_hub_table"), (hub_io, "read_hub"), (formats, "read_part")):
            trap.setattr(module, name, not_here)
        engine = _engine(3)
        folder = tmp_path / "ray"
        with engine.stage(folder):
            loaded = load.load(None, hub, load.StageContext(out_dir=folder, engine=engine))
        with pytest.raises(AssertionError, match="the driver read"):
            _load(hub, LocalEngine(), tmp_path)
    assert loaded.data.to_list() == expected[1] and loaded.stats == expected[4]


@pytest.mark.slow
def test_a_dataset_load_dataset_holds_in_memory_is_read_on_the_driver(tmp_path, ray_cluster, hub, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "IN_MEMORY_MAX_SIZE", 2**30)  # small datasets are then kept in memory
    assert formats.plan_parts(Path(hub.path), hub, 7) == [parts.WHOLE]
    assert len(_same(hub, 7, tmp_path)[1]) == 48


@pytest.mark.slow
def test_a_task_that_cannot_see_the_hf_cache_fails_in_one_line(tmp_path, ray_cluster, hub):
    pieces = formats.plan_parts(Path(hub.path), hub, 2)
    missing = pieces[0].rows[1][0]
    shutil.move(tmp_path / "cache", tmp_path / "elsewhere")  # as on a node that does not mount the driver's cache
    engine = _engine(2)
    with pytest.raises(ValueError) as failed:
        ray_load._read(engine, ray_cluster, Path(hub.path), hub, pieces, engine.map_folder())
    assert str(failed.value).startswith(f"{missing}: not found on Ray node ")
    assert "(HF_DATASETS_CACHE) must be on storage every node sees" in str(failed.value)
    assert "\n" not in str(failed.value)
