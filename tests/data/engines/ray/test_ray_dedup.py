"""Dedup and the leakage check on Ray read no text or id column on the driver (ray_dedup.py, shuffle.py):
tasks read their rows from the stage's files, the driver gets no per-row state (dedup: counts and refs;
leakage: the hits), and the answer is still the local engine's byte for byte."""

from __future__ import annotations

import contextlib
import json
import random

import numpy as np
import pytest

from pipeline.config import DedupConfig, RayConfig, SplitConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.similarity.minhash import normalize_text
from pipeline.data.stages import split
from pipeline.data.stages.dedup import REPORT, dedup, first_of_texts
from tests.stagecheck import stable

VOCAB = [f"w{k}" for k in range(4000)]
VOLATILE = {"seconds", "signature_processes"}
CFG = DedupConfig(method="minhash", threshold=0.75, num_perm=128)


def _ties() -> tuple[list[str], list[str]]:
    """Unrelated texts, plus: exact copies in other case and spacing with the same id (the smallest raw
    text is kept) and with other ids (the smallest id, here the copy's); near duplicates of the same
    length and id (ties by raw text); chains A~B~C with an exact copy of B."""
    rng = random.Random(7)
    texts = [" ".join(rng.choice(VOCAB) for _ in range(60)) for _ in range(300)]
    ids = [f"u{k:04d}" for k in range(300)]
    for k in range(10):
        texts += [texts[k].upper(), "  " + texts[k] + " ", texts[k].title()]
        ids += [ids[k]] * 3
    for k in range(10, 20):
        texts.append(texts[k].upper())
        ids.append(f"a{k:04d}")  # 'a' < 'u': the copy has the smaller id
    for k in range(20, 30):  # one word swapped for another of the same length: J = 55/61
        words = texts[k].split()
        words[7] = "q" + words[7][1:]
        texts.append(" ".join(words))
        ids.append(ids[k])
    for k in range(30, 40):  # A~B (J = 53/63) and B~C, A and C apart (J = 48/68)
        b = texts[k].split()
        b[3:6] = ["x1", "x2", "x3"]
        c = b[:]
        c[40:43] = ["y1", "y2", "y3"]
        texts += [" ".join(b), " ".join(c), " ".join(b).upper()]
        ids += [f"b{k:04d}", f"c{k:04d}", f"d{k:04d}"]
    return texts, ids


def _on_disk(tmp_path, name, texts, ids, splits):
    """A memory-mapped Dataset, as a stage's input is (a task reads its rows from these files)."""
    from datasets import Dataset, load_from_disk

    n = len(texts)
    Dataset.from_dict({"id": ids, "text": texts, "label": ["a"] * n, "source_split": splits}).save_to_disk(
        str(tmp_path / name))
    return load_from_disk(str(tmp_path / name))


@contextlib.contextmanager
def nothing_read_on_the_driver():
    """Records every read of a Dataset's columns or rows in this process (Ray's workers are others)."""
    import datasets

    read, patch = [], pytest.MonkeyPatch()
    getitem, select_column = datasets.Dataset.__getitem__, datasets.Dataset._fast_select_column

    def wrap(name, real):
        def spy(self, *args, **kwargs):
            read.append((name, args[:1]))
            return real(self, *args, **kwargs)
        return spy

    patch.setattr(datasets.Dataset, "__getitem__", wrap("getitem", getitem))
    patch.setattr(datasets.Dataset, "_fast_select_column", wrap("column", select_column))
    for name in ("__iter__", "iter", "to_list", "to_dict", "to_pandas", "flatten_indices"):
        patch.setattr(datasets.Dataset, name, wrap(name, getattr(datasets.Dataset, name)))
    try:
        yield read
    finally:
        patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("blocks,shuffled,keep_test_whole", [(1, False, False), (2, True, True), (7, True, False),
                                                             (7, False, True)])
def test_ray_dedup_reads_no_column_on_the_driver_and_equals_local(tmp_path, ray_cluster, blocks, shuffled,
                                                                   keep_test_whole):
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _ties()
    splits = ["test" if k % 3 == 0 else "train" for k in range(len(texts))] if keep_test_whole else [""] * len(texts)
    cfg = DedupConfig(**{**CFG.__dict__, "keep_test_whole": keep_test_whole})
    order = list(range(len(texts)))
    if shuffled:
        random.Random(blocks).shuffle(order)
    outs = {}
    engines = (("local", None, range(len(texts))), ("ray", RayEngine.connect(RayConfig(blocks=blocks)), order))
    for name, engine, rows in engines:
        (tmp_path / name).mkdir()
        ds = _on_disk(tmp_path, f"in-{name}", *([v[i] for i in rows] for v in (texts, ids, splits)))
        ctx = StageContext(out_dir=tmp_path / name, engine=engine)
        with nothing_read_on_the_driver() if engine else contextlib.nullcontext([]) as read:
            result = dedup(ds, cfg, ctx)
        assert read == []  # not a column, not a row: tasks read them
        kept = sorted(zip(result.data["id"][:], result.data["text"][:]))
        outs[name] = (kept, result.dropped, stable(result.stats, VOLATILE), (tmp_path / name / REPORT).read_bytes())
    assert outs["ray"] == outs["local"]
    kept = dict((t, i) for i, t in outs["local"][0])
    assert kept.get(texts[330]) == "a0010"  # a copy with another id: the smallest id (and a test row)
    report = [json.loads(line) for line in outs["local"][3].decode().splitlines()]
    tie = next(c for c in report if c["kept"] == ids[20])
    if not keep_test_whole:  # otherwise a test row comes first
        # exact copies with the same id: the smallest raw text is kept
        assert all(min(texts[k], *texts[300 + 3 * k: 303 + 3 * k]) in kept for k in range(10))
        assert tie["text"] == min(texts[20], texts[340])[:200]  # equal length and id: the smaller raw text
        chain = next(c for c in report if c["kept"] == ids[30])
        assert chain["size"] == 4 and min(r["similarity"] for r in chain["removed"]) < cfg.threshold


def _scaled(units: int) -> tuple[list[str], list[str]]:
    """`units` x (an unrelated text, one with an exact copy, one with a near copy of it): 5 rows each."""
    rng = random.Random(units)
    texts, ids = [], []
    for u in range(units):
        a, b = (" ".join(rng.choice(VOCAB) for _ in range(60)) for _ in range(2))
        near = b.split()
        near[7] = "q" + near[7][1:]
        texts += [a, b, b.upper(), " ".join(near), " ".join(rng.choice(VOCAB) for _ in range(60))]
        ids += [f"s{u:05d}-{k}" for k in range(5)]
    return texts, ids


def _driver_bytes(tmp_path, name: str, units: int, monkeypatch) -> tuple[int, dict]:
    """Bytes the driver receives from (engine.get) and puts into (ray.put) the object store during a
    Ray dedup of _scaled(units) with min-label propagation (ray.driver_edges=0); and its drops."""
    import pickle

    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _scaled(units)
    ds = _on_disk(tmp_path, f"in-{name}", texts, ids, [""] * len(texts))
    engine, moved = RayEngine.connect(RayConfig(blocks=3, driver_edges=0)), [0]
    real_get, real_put = engine.get, ray.put

    def get(refs, what):
        value = real_get(refs, what)
        moved[0] += len(pickle.dumps(value, protocol=5))
        return value

    def put(value, **kwargs):
        moved[0] += len(pickle.dumps(value, protocol=5))
        return real_put(value, **kwargs)

    monkeypatch.setattr(engine, "get", get)
    monkeypatch.setattr(ray, "put", put)
    (tmp_path / name).mkdir()
    result = dedup(ds, CFG, StageContext(out_dir=tmp_path / name, engine=engine))
    monkeypatch.undo()
    return moved[0], result.dropped


@pytest.mark.slow
def test_what_the_driver_receives_does_not_grow_with_the_rows(tmp_path, ray_cluster, monkeypatch):
    """No per-row state on the driver: 4x the rows (and clusters) moves no more bytes between the driver
    and the object store, beyond a few rounds of propagation (before: 24 B per row of hashes and
    lengths, then the ids and texts of the clustered rows)."""
    small, dropped_small = _driver_bytes(tmp_path, "small", 100, monkeypatch)
    big, dropped_big = _driver_bytes(tmp_path, "big", 400, monkeypatch)
    assert dropped_small == {"exact_duplicate": 100, "near_duplicate": 100}
    assert dropped_big == {"exact_duplicate": 400, "near_duplicate": 400}
    assert big - small < 1500 * 0.5, (small, big)  # under 0.5 B per added row (1,500 of them)


@pytest.mark.slow
def test_clusters_spread_over_blocks_and_partitions_plan_as_one(tmp_path, ray_cluster):
    """_ties shuffled into 7 blocks: chains A~B~C whose rows lie in 3 blocks and hash to 3 partitions,
    an exact group (B and its copy) joined in another partition than its cluster's key (the chain's
    smallest node), protected test rows (a chain's B, an exact copy): the local engine's rows, drops,
    stats and report."""
    from pipeline.data.engines.ray import tasks as ray_tasks
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _ties()
    splits = ["test" if k in (365, 304) else "train" for k in range(len(texts))]  # chain 35's B; a copy of text 1
    order = list(range(len(texts)))
    random.Random(11).shuffle(order)
    at = {r: p for p, r in enumerate(order)}  # each original row's place in the shuffled input
    blocks = 7
    engine = RayEngine.connect(RayConfig(blocks=blocks, driver_edges=0))
    bounds = engine.block_bounds(len(texts))
    block = lambda r: next(k for k, (s, e) in enumerate(bounds) if s <= at[r] < e)  # noqa: E731
    part = lambda key: int(ray_tasks._partition_of(np.array([key]), blocks)[0])  # noqa: E731
    chains = [(k, 350 + 3 * (k - 30), 351 + 3 * (k - 30), 352 + 3 * (k - 30)) for k in range(30, 40)]  # A, B, C, B's copy
    assert any(len({part(_hash(texts[r])) for r in c[:3]}) == 3 and len({block(r) for r in c[:3]}) == 3 for c in chains)
    # B's group is joined where its first (smallest place) lies; the cluster is keyed by its smallest node
    assert any(part(min(at[b], at[copy])) != part(min(at[a], at[b], at[copy], at[c])) for a, b, c, copy in chains)
    cfg = DedupConfig(**{**CFG.__dict__, "keep_test_whole": True})
    outs = {}
    for name, eng, rows in (("local", None, range(len(texts))), ("ray", engine, order)):
        (tmp_path / name).mkdir()
        ds = _on_disk(tmp_path, f"in-{name}", *([v[i] for i in rows] for v in (texts, ids, splits)))
        result = dedup(ds, cfg, StageContext(out_dir=tmp_path / name, engine=eng))
        outs[name] = (sorted(result.data["id"][:]), result.dropped, stable(result.stats, VOLATILE),
                      (tmp_path / name / REPORT).read_bytes())
    assert outs["ray"] == outs["local"]
    report = {c["kept"]: c for c in map(json.loads, outs["local"][3].decode().splitlines())}
    assert report[ids[365]]["size"] == 4 and report[ids[365]]["kept_within_test"] == []  # the test row B is kept
    assert report[ids[1]]["text"] == texts[304][:200] and len(report[ids[1]]["removed"]) == 3  # the test copy
    assert outs["local"][2]["test_split"] == {"rows": 2, "removed": 0, "kept_within_test": 0, "kept_whole": True}


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"method": "exact"}, {"verify": False, "shingle": "char", "ngram": 5}])
def test_exact_method_and_the_estimate_check_on_ray_equal_local(tmp_path, ray_cluster, settings):
    """method=exact (no near search: every cluster keyed by its exact group's first row) and the MinHash
    estimate check with character shingles (the report's similarities still exact, from each
    cluster's own shingles)."""
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _ties()
    cfg = DedupConfig(**{**CFG.__dict__, **settings})
    outs = {}
    for name, engine in (("local", None), ("ray", RayEngine.connect(RayConfig(blocks=4)))):
        (tmp_path / name).mkdir()
        ds = _on_disk(tmp_path, f"in-{name}", texts, ids, [""] * len(texts))
        result = dedup(ds, cfg, StageContext(out_dir=tmp_path / name, engine=engine))
        outs[name] = (result.data["id"][:], result.dropped, stable(result.stats, VOLATILE),
                      (tmp_path / name / REPORT).read_bytes())
    assert outs["ray"] == outs["local"]
    dropped = outs["local"][1]
    # 50 exact copies; with the near search, the 10 copies of a chain's removed B are near ones (as B is)
    assert dropped["exact_duplicate"] == (50 if cfg.method == "exact" else 40)
    assert (dropped["near_duplicate"] == 0) == (cfg.method == "exact")


def _hash(text: str) -> int:
    import hashlib

    h = np.frombuffer(hashlib.blake2b(normalize_text(text).encode("utf-8", "surrogatepass"), digest_size=16).digest(),
                      dtype=np.uint64)
    return int(h[0] ^ h[1])


@pytest.mark.slow
def test_a_hash_collision_never_merges_different_texts(tmp_path, ray_cluster):
    """Rows whose hashes are made equal on purpose (the exact-group task given them so): only those with
    the same normalized text form a group, labelled by its smallest row, as first_of_texts labels it."""
    from pipeline.data.engines.ray import dedup as ray_dedup
    from pipeline.data.engines.ray import io as ray_io

    texts = ["a b", "c d", "A  B", "e f", "C D", "a b ", "g h"]
    ds = _on_disk(tmp_path, "in", texts, list("uvwxyzq"), [""] * len(texts))
    triples = np.array([[5, 1, r] for r in range(6)] + [[2, 9, 6]], dtype=np.uint64)  # rows 0-5 "collide"
    starts = np.array([0, 4, len(texts)])
    copies, *out = ray_dedup._exact_groups(ray_io.pack(ds), starts, 2, triples[4:], triples[:4])
    per_block, pairs = out[:2], np.concatenate(out[2:])
    assert copies == 3 and [b.tolist() for b in per_block] == [[2], [4, 5]]
    assert sorted(map(tuple, pairs.tolist())) == [(0, 0), (0, 2), (0, 5), (1, 1), (1, 4)]
    first = first_of_texts([normalize_text(t) for t in texts])
    assert all(first[m] == f for f, m in pairs.tolist())


@pytest.mark.slow
def test_ray_leakage_check_reads_no_column_on_the_driver_and_equals_local(tmp_path, ray_cluster, monkeypatch):
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _ties()
    for k in range(100, 130):  # leaks: 5 of 60 words off (J = 43/73), in whichever split their ids fall
        words = texts[k].split()
        words[5:30:6] = ["leak"] * 5
        texts.append(" ".join(words))
        ids.append(f"leak{k}")
    cfg, outs, seen = DedupConfig(method="none"), {}, []
    leakage = split._leakage

    def guarded(parts, split_cfg, ctx):
        with nothing_read_on_the_driver() if ctx.engine.name == "ray" else contextlib.nullcontext([]) as read:
            out = leakage(parts, split_cfg, ctx)
        seen.append(read)
        return out

    monkeypatch.setattr(split, "_leakage", guarded)
    for name, engine in (("local", None), ("ray", RayEngine.connect(RayConfig(blocks=4)))):
        (tmp_path / name).mkdir()
        ctx = StageContext(out_dir=tmp_path / name, engine=engine, similarity=cfg)
        ds = _on_disk(tmp_path, f"in-{name}", texts, ids, [""] * len(texts))
        parts = split.split(ds, SplitConfig(leakage_threshold=0.5, leakage="remove"), ctx)
        outs[name] = ({s: parts.data[s]["id"][:] for s in parts.data}, parts.dropped,
                      (tmp_path / name / "leakage.jsonl").read_bytes())
    assert seen[1] == []  # the Ray check: not a column, not a row on the driver
    assert outs["ray"] == outs["local"]
    assert len(outs["local"][2].decode().splitlines()) >= 5 and sum(outs["local"][1].values()) >= 5
