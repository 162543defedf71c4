"""Dedup and the leakage check on Ray read no text or id column on the driver (ray_dedup.py): tasks read
their rows from the stage's files, the driver gets fixed-width facts per row and the strings of only
the rows in a cluster (leakage: with a hit), and the answer is still the local engine's byte for byte."""

from __future__ import annotations

import contextlib
import json
import random

import numpy as np
import pytest
from stagecheck import stable

from pipeline.config import DedupConfig, RayConfig, SplitConfig
from pipeline.data import ray_dedup, split
from pipeline.data.common import StageContext
from pipeline.data.dedup import REPORT, Strings, dedup, first_of_texts
from pipeline.data.minhash import normalize_text

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


@pytest.mark.parametrize("blocks,shuffled,keep_test_whole", [(1, False, False), (2, True, True), (7, True, False),
                                                             (7, False, True)])
def test_ray_dedup_reads_no_column_on_the_driver_and_equals_local(tmp_path, ray_cluster, blocks, shuffled,
                                                                   keep_test_whole):
    from pipeline.data.engine_ray import RayEngine

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


def test_the_driver_fetches_the_strings_of_only_the_rows_in_a_cluster(tmp_path, ray_cluster):
    from pipeline.data.engine_ray import RayEngine

    texts, ids = _ties()
    ds = _on_disk(tmp_path, "in", texts, ids, [""] * len(texts))
    plan, strings = RayEngine.connect(RayConfig(blocks=3)).plan_dedup(ds, CFG, None)
    clustered = set(plan.members.tolist()) | set(plan.kept_of.tolist())
    assert set(strings.ids) == set(strings.texts) == clustered and strings.fetched == len(clustered)
    planted = set(range(40)) | set(range(300, len(texts)))  # the originals and their copies: 120 rows
    assert clustered <= planted and len(clustered) >= 110  # (LSH may miss a link of a chain)


def test_a_hash_collision_never_merges_different_texts():
    """Rows whose hashes are made equal on purpose: only those with the same normalized text stay one group."""
    texts = ["a b", "c d", "A  B", "e f", "C D", "a b "]
    by_hash = np.zeros(len(texts), dtype=np.int64)  # every row "collides" with row 0
    assert ray_dedup.verified_first(by_hash, Strings(list("uvwxyz"), texts)).tolist() == [0, 1, 0, 3, 1, 0]
    assert ray_dedup.verified_first(by_hash, Strings(list("uvwxyz"), texts)).tolist() == first_of_texts(
        [normalize_text(t) for t in texts]).tolist()
    h = np.array([[5, 1], [2, 9], [5, 1], [2, 8], [2, 9]], dtype=np.uint64)
    assert ray_dedup.first_of_hashes(h).tolist() == [0, 1, 0, 3, 1]


def test_ray_leakage_check_reads_no_column_on_the_driver_and_equals_local(tmp_path, ray_cluster, monkeypatch):
    from pipeline.data.engine_ray import RayEngine

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
