"""The Ray engine's disk side: row-wise maps whose tasks read their rows from the stage's files and
write one shard each, stage folders written shard by shard by tasks that equal save_to_disk's, a
file a worker cannot see named in one line, and a stage whose worker is killed never complete."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline import artifacts
from pipeline.config import CleanConfig, RayConfig
from pipeline.data import runner
from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import map_batches
from tests.data.engines.ray.test_engine_ray import kill_first  # the killer of the dedup fault test


def _saved(tmp_path: Path, n: int = 500):
    """A Dataset read back from disk (memory-mapped, as a stage's input is), texts of varying length."""
    import datasets

    rng = random.Random(4)
    ds = datasets.Dataset.from_dict({"id": [f"d{k:04d}" for k in range(n)],
                                     "text": [" ".join(["w"] * rng.randint(1, 30)) + f" {k}" for k in range(n)]})
    ds.save_to_disk(str(tmp_path / "in"))
    return datasets.load_from_disk(str(tmp_path / "in"))


def _words(batch):
    return {"words": [len(t.split()) for t in batch["text"]], "text": [t.upper() for t in batch["text"]]}


def _engine(**kw):
    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    return RayEngine.connect(RayConfig(**kw))


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 2, 7])
def test_a_map_on_ray_reads_its_rows_from_disk_and_equals_the_local_map(tmp_path, ray_cluster, blocks):
    import datasets

    ds = _saved(tmp_path)
    order = list(range(ds.num_rows))
    random.Random(blocks).shuffle(order)
    picked = ds.select(order[:333])  # an indices mapping over the files, as split's select makes one
    added = {"words": datasets.Value("int64"), "text": datasets.Value("string")}
    local = map_batches(picked, _words, added, batch_size=64)
    engine = _engine(blocks=blocks)
    with engine.stage(tmp_path / "stage"):
        mapped = engine.map_batches(picked, _words, added, batch_size=64)
        shards = [Path(f["filename"]) for f in mapped.cache_files]
        assert len(shards) == blocks and all(p.parent.parent == tmp_path / "stage" / ".ray-maps" for p in shards)
        assert mapped.features == local.features and mapped.to_list() == local.to_list()
        assert mapped[0]["words"] == len(ds[order[0]]["text"].split())
    assert not (tmp_path / "stage" / ".ray-maps").exists()  # removed before the stage folder is renamed


@pytest.mark.slow
def test_a_stage_folder_saved_on_ray_is_what_save_to_disk_writes(tmp_path, ray_cluster):
    """Each shard by a task from the rows' own files, the metadata by the driver: file for file the
    bytes of save_to_disk with as many shards, a DatasetDict and an empty split included."""
    import datasets

    ds = _saved(tmp_path)
    dd = datasets.DatasetDict({"train": ds.select(range(10, 400)), "validation": ds.select([7, 3, 450]),
                               "test": ds.select([])})
    engine = _engine(blocks=3)
    engine.save(dd, tmp_path / "ray")
    dd.save_to_disk(str(tmp_path / "local"), num_shards={"train": 3, "validation": 3, "test": 1})
    ray_files = sorted(p.relative_to(tmp_path / "ray") for p in (tmp_path / "ray").rglob("*"))
    assert ray_files == sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*"))
    assert Path("train/data-00002-of-00003.arrow") in ray_files and Path("test/data-00000-of-00001.arrow") in ray_files
    for rel in ray_files:
        if (tmp_path / "ray" / rel).is_file():
            assert (tmp_path / "ray" / rel).read_bytes() == (tmp_path / "local" / rel).read_bytes(), rel
    back = datasets.load_from_disk(str(tmp_path / "ray"))
    assert back["validation"]["id"][:] == ["d0007", "d0003", "d0450"] and back["test"].num_rows == 0


@pytest.mark.slow
def test_a_file_a_worker_cannot_see_is_one_line_naming_it(tmp_path, ray_cluster):
    """What a node without the shared output_dir meets: the stage's file is not there."""
    import shutil

    import datasets

    ds = _saved(tmp_path)
    gone = ds.cache_files[0]["filename"]
    shutil.rmtree(tmp_path / "in")  # the driver still has it mapped; a worker opening it by name does not
    engine = _engine(blocks=2)
    with pytest.raises(ValueError, match=rf"^{gone}: not found on Ray node .*: with prepare.engine=ray every node "
                                         r"reads and writes the stage folders itself, so output_dir .* must be on "
                                         r"storage every node sees \(a shared filesystem\)$"):
        engine.map_batches(ds, _words, {"words": datasets.Value("int64"), "text": datasets.Value("string")})


def _slow_upper(batch):
    time.sleep(0.2)  # long enough for the killer below to catch a map task running
    return {"text": [t.upper() for t in batch["text"]]}


def _slow_stage(ds, cfg, ctx: StageContext) -> StageResult:
    import datasets

    return StageResult(ctx.engine.map_batches(ds, _slow_upper, {"text": datasets.Value("string")}, batch_size=20))


@pytest.mark.slow
@pytest.mark.parametrize("retries", [2, 0])
def test_a_worker_killed_while_writing_its_shard_never_leaves_a_complete_stage(tmp_path, ray_cluster, retries):
    from pipeline.data.engines.base import StageFailed

    ds = _saved(tmp_path, n=200)
    out = tmp_path / "stages" / "1-clean-x"
    stage = runner.Stage("clean", _slow_stage, CleanConfig())
    ctx = StageContext(out_dir=out, engine=_engine(blocks=2, max_retries=retries))
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=kill_first, args=("map_shard", stop, killed))
    killer.start()
    try:
        if retries:
            data, man = runner._run_stage(stage, ds, out, "x", "y", ctx)
        else:
            with pytest.raises(StageFailed, match=r"^map on Ray failed: a worker was lost and ray.max_retries=0"):
                runner._run_stage(stage, ds, out, "x", "y", ctx)
    finally:
        stop.set()
        killer.join()
    assert killed, "no map task was seen running"
    if retries:  # rerun by Ray: its shard written again from the start, the stage whole
        assert data["text"][:] == [t.upper() for t in ds["text"][:]] and man["rows_out"] == 200
        assert sorted(p.name for p in (out / "data").iterdir()) == [
            "data-00000-of-00002.arrow", "data-00001-of-00002.arrow", "dataset_info.json", "state.json"]
    else:
        assert not out.exists() and not artifacts.is_complete(out)
        assert list(out.parent.iterdir()) == []  # nor a temporary left behind
