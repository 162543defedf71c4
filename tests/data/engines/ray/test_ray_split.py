"""Split and label on Ray without per-row state on the driver (ray_split.py): the stratified cuts found
by the distributed selection give _stratified_codes's split (several classes, classes of 1-3 rows,
forced ties of hash, few or many buckets, 1, 2 and 7 blocks); the leakage check's removal and
label.unknown=drop equal the local engine's; and the bytes the driver receives during split do not
grow with the rows, nor does it select rows."""

from __future__ import annotations

import functools
import pickle
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import DedupConfig, LabelConfig, SplitConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import SPLITS, unit_hash
from pipeline.data.engines.ray import split as ray_split
from pipeline.data.stages import split
from pipeline.tasks.classification import label
from tests.data.engines.ray.test_ray_stages import _engine as ray_engine
from tests.data.engines.ray.test_ray_stages import _saved

BLOCKS = [1, 2, 7]


def _engine(**kw):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module's keys run on the workers
    return ray_engine(**kw)


def _corpus(tmp_path: Path, sizes: dict[str, int], name: str = "docs"):
    """Classes of the given sizes, their rows shuffled together (ids unique, as load makes them)."""
    labels = [c for c, n in sizes.items() for _ in range(n)]
    random.Random(3).shuffle(labels)
    n = len(labels)
    return _saved(tmp_path, name, {"id": [f"r{(k * 7919) % 100003:06d}" for k in range(n)],
                                   "text": [f"text {k}" for k in range(n)], "label": labels, "source_split": [""] * n})


def _tied_keys(table, classes):
    """Hashes rounded to eighths: most rows of a class share their hash with others (and 1.0 occurs)."""
    index = {c: k for k, c in enumerate(classes)}
    u = np.array([round(unit_hash(5, i) * 8) / 8 for i in table.column("id").to_pylist()])
    return u, np.array([index[c] for c in table.column("label").to_pylist()], dtype=np.int32)


def _local_split(ds, keys, cuts) -> dict[str, list[str]]:
    """_stratified_codes over the whole corpus's keys: each split's ids, in row order."""
    table = ds.with_format("arrow")[:]
    u, cls = keys(table)
    ids = table.column("id").to_pylist()
    codes = split._stratified_codes(u, cls, cuts, lambda rows: [ids[k] for k in rows.tolist()])
    return {s: [i for i, c in zip(ids, codes.tolist()) if c == k] for k, s in enumerate(SPLITS)}


SIZES = {"big": 230, "mid": 61, "one": 1, "two": 2, "three": 3}


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("buckets", [2**16, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_stratified_cuts_on_ray_equal_stratified_codes(tmp_path, ray_cluster, monkeypatch, blocks, buckets, tied):
    monkeypatch.setattr(ray_split, "BUCKETS", buckets)  # 4: tens of rows per bucket, the rank within it matters
    ds = _corpus(tmp_path, SIZES)
    if tied:  # and repeated ids (a stage run on its own may see them): equal (hash, id), ranked by row
        ids = ds["id"][:]
        ds = _saved(tmp_path, "repeated", {**ds.to_dict(), "id": ids[:40] + ids[:40] + ids[80:]})
    classes = sorted(SIZES)
    keys = (functools.partial(_tied_keys, classes=classes) if tied
            else functools.partial(split._hash_and_class, seed=5, classes=classes))
    engine = _engine(blocks=blocks)
    for cuts in [(0.8, 0.9), (0.5, 0.75), (0.9, 0.9), (1.0, 1.0)]:
        want = _local_split(ds, keys, cuts)
        with engine.stage(tmp_path / "stage"):
            got = ray_split.stratified_rows(engine, ds, keys, len(classes), cuts)
            assert {s: got[s]["id"][:] for s in SPLITS} == want, cuts
            files = [f["filename"] for s in SPLITS for f in got[s].cache_files]  # the tasks' shards, not a select
            assert files and all(f.startswith(str(tmp_path / "stage")) for f in files) and len(files) <= 3 * blocks
    if tied:  # the forcing worked: hashes shared within a class, and at a cut
        u, cls = keys(ds.with_format("arrow")[:])
        assert len(set(zip(u.tolist(), cls.tolist()))) < 0.1 * ds.num_rows and 1.0 in u


@pytest.mark.slow
def test_one_id_repeated_is_ranked_by_row_as_locally(tmp_path, ray_cluster):
    ds = _saved(tmp_path, "one-id", {"id": ["x"] * 5 + ["y", "z"], "text": ["t"] * 7, "label": ["a"] * 5 + ["b"] * 2,
                                     "source_split": [""] * 7})
    keys = functools.partial(split._hash_and_class, seed=5, classes=["a", "b"])
    engine = _engine(blocks=2)
    with engine.stage(tmp_path / "stage"):
        got = ray_split.stratified_rows(engine, ds, keys, 2, (0.4, 0.8))
        rows = {s: got[s]["id"][:] for s in SPLITS}
    assert rows == _local_split(ds, keys, (0.4, 0.8)) and rows["train"].count("x") == 2 and rows["test"] == ["x"]


def test_the_cut_ranks_are_those_of_stratified_codes():
    counts = np.array([[0, 3, 0, 2], [1, 0, 0, 0], [0, 0, 0, 0]])  # classes of 5, 1 and 0 rows
    # ranks round(5 * 0.8) = round(5 * 0.9) = 4: bucket 3's second row; a class of one is all train
    assert ray_split._targets(counts, (0.8, 0.9)) == [[[3, 1], [3, 1]], [None, None], [None, None]]
    assert ray_split._targets(counts, (0.2, 0.6)) == [[[1, 1], [3, 0]], [[0, 0], None], [None, None]]
    assert ray_split.buckets_for(3) == 2**16 and ray_split.buckets_for(1000) == 2**12


def _leaky(tmp_path: Path):
    """Train documents, and validation/test copies of some of them (the leakage check's hits)."""
    n = 240
    texts = [" ".join(f"w{(k * 13 + j) % 997}x{k}" for j in range(12)) for k in range(n)]
    texts[100:130] = [texts[k] + " again" for k in range(30)]  # near copies of rows 0-29
    return _saved(tmp_path, "leaky", {"id": [f"d{k:04d}" for k in range(n)], "text": texts,
                                      "label": ["pos" if k % 3 else "neg" for k in range(n)],
                                      "source_split": ["test" if 100 <= k < 115 else "validation" if 115 <= k < 130
                                                       else "train" for k in range(n)]})


def _both(stage, data, cfg, tmp_path: Path, blocks: int, **ctx) -> dict:
    out = {}
    for name, engine in (("local", LocalEngine()), ("ray", _engine(blocks=blocks))):
        (tmp_path / name).mkdir(exist_ok=True)
        with engine.stage(tmp_path / name / "stage"):
            r = stage(data, cfg, StageContext(out_dir=tmp_path / name, engine=engine, progress=False, **ctx))
            rows = {s: (r.data[s].features, r.data[s].to_list()) for s in SPLITS}
        side = tmp_path / name / "leakage.jsonl"
        out[name] = (rows, r.dropped, r.stats, side.read_bytes() if side.exists() else None)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("whole", [False, True])
def test_the_leakage_check_removes_on_ray_what_it_removes_locally(tmp_path, ray_cluster, blocks, whole):
    out = _both(split.split, _leaky(tmp_path), SplitConfig(leakage_threshold=0.5), tmp_path, blocks,
                similarity=DedupConfig(keep_test_whole=whole))
    assert out["ray"] == out["local"]
    assert out["local"][1] == ({"leak_train": 15, "leak_validation": 15} if whole else
                               {"leak_validation": 15, "leak_test": 15})


@pytest.mark.slow
@pytest.mark.parametrize("chunk", ["none", "words"])
def test_split_on_ray_writes_whole_documents_once_and_maps_only_to_chunk(tmp_path, ray_cluster, monkeypatch, chunk):
    """split.chunk=none: the route pass writes the documents as the chunk map leaves them (id, text,
    label, chunk 0), so no chunk map runs and split writes each row once; chunking asked, the map runs.
    Either way, leakage removal included, the stage equals the local engine's."""
    from pipeline.data.engines.ray import engine as engine_ray

    maps, real = [], engine_ray.RayEngine.map_batches

    def spy(self, ds, fn, added, **kw):
        maps.append(kw.get("desc"))
        return real(self, ds, fn, added, **kw)

    monkeypatch.setattr(engine_ray.RayEngine, "map_batches", spy)
    cfg = SplitConfig(leakage_threshold=0.5, chunk=chunk, chunk_size=5, chunk_overlap=1)
    out = _both(split.split, _leaky(tmp_path), cfg, tmp_path, 2, similarity=DedupConfig())
    assert out["ray"] == out["local"] and out["local"][1] == {"leak_validation": 15, "leak_test": 15}
    assert maps == ([] if chunk == "none" else ["chunk"] * 3)
    rows = out["local"][0]["train"][1]
    assert {r["chunk"] for r in rows} == ({0} if chunk == "none" else {0, 1, 2})


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
def test_label_drop_on_ray_writes_only_the_kept_rows(tmp_path, ray_cluster, blocks):
    import datasets

    ds = _corpus(tmp_path, {"pos": 90, "neg": 50, "odd": 20}).remove_columns("source_split")
    dd = datasets.DatasetDict({"train": ds.select(range(100)), "validation": ds.select(range(100, 160)),
                               "test": ds.select([])})
    out = _both(label.label, dd, LabelConfig(names=["neg", "pos"], unknown="drop"), tmp_path, blocks)
    assert out["ray"] == out["local"] and out["local"][1] == {"unknown_label": 20}
    assert sum(len(out["local"][0][s][1]) for s in SPLITS) == 140


# ---------------------------------------------------------------- what the driver receives


def _received(engine, monkeypatch) -> list:
    """Count the pickled bytes of everything engine.get hands the driver; and every driver-side select."""
    import datasets

    got, get = [], engine.get

    def counted(refs, what):
        out = get(refs, what)
        got.append(len(pickle.dumps(out)))
        return out

    select = datasets.Dataset.select

    def selected(self, indices, *args, **kwargs):
        got.append(("select", len(indices)))
        return select(self, indices, *args, **kwargs)

    monkeypatch.setattr(engine, "get", counted)
    monkeypatch.setattr(datasets.Dataset, "select", selected)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("stratify", [False, True])
def test_the_split_driver_receives_no_bytes_per_row(tmp_path, ray_cluster, monkeypatch, stratify):
    engine, sent, selects = _engine(blocks=3), {}, []
    for n in (2000, 8000):
        ds = _corpus(tmp_path, {"a": n // 2, "b": n // 4, "c": n // 4}, name=f"docs-{n}")
        with monkeypatch.context() as m, engine.stage(tmp_path / f"stage-{n}"):
            got = _received(engine, m)
            parts = split.split(ds, SplitConfig(leakage="off", stratify=stratify),
                                StageContext(out_dir=tmp_path, engine=engine, progress=False)).data
        sent[n], selects = sum(g for g in got if isinstance(g, int)), selects + [g for g in got if isinstance(g, tuple)]
        assert sum(parts[s].num_rows for s in SPLITS) == n
    assert sent[8000] - sent[2000] < 0.05 * 6000, sent  # the split codes alone were 1 B per row
    assert not selects, "the driver selected rows"


@pytest.mark.slow
def test_the_leakage_removal_and_label_drop_keep_no_row_indices_on_the_driver(tmp_path, ray_cluster, monkeypatch):
    """The driver selects only the rows with a leak (their ids, for leakage.jsonl) and filters nothing."""
    import datasets

    engine, filtered, ds = _engine(blocks=3), [], _leaky(tmp_path)
    through = datasets.Dataset.filter
    monkeypatch.setattr(datasets.Dataset, "filter", lambda *a, **k: filtered.append(1) or through(*a, **k))
    with monkeypatch.context() as m, engine.stage(tmp_path / "stage"):
        got = _received(engine, m)
        ctx = StageContext(out_dir=tmp_path, engine=engine, progress=False, similarity=DedupConfig())
        parts = split.split(ds, SplitConfig(leakage_threshold=0.5), ctx)
        labelled = label.label(parts.data, LabelConfig(names=["pos"], unknown="drop"), ctx)
    assert parts.dropped == {"leak_validation": 15, "leak_test": 15} and not filtered
    assert max(g[1] for g in got if isinstance(g, tuple)) <= 15  # the hits' rows; the kept rows were 225
    assert labelled.dropped == {"unknown_label": 70} and labelled.data["train"].num_rows == 140
