"""Several processes for real: pipeline/train.py as 2 gloo processes on one machine
(configs/accelerate/cpu_multiprocess.yaml) and as two "machines" on localhost (two launchers, machine ranks
0 and 1: cpu_two_machines_rank{0,1}.yaml), with a tiny BERT on a toy task.

Each scenario runs once per module (a fixture) and several tests read what it left. All runs share
one prepared dataset, built once. The one-process runs the 2-process ones are compared with run in this
process (multikit.train_here: the same loop on the same config, while the 2-process run trains beside it).
`accelerate launch` starts the processes where the launcher is part of what is tested: the two-machine pair
(two launchers), and a SIGTERM to one rank of cpu_multiprocess.yaml's pair (torchrun's report of it). Elsewhere
(2 == 1 process, elastic resume, the resume after the SIGTERM, a dead or a hung rank) the ranks are real
processes forked from the warm zygote with the environment `accelerate launch` gives its workers
(trainkit.fork_launch_ranks: no launcher, no imports). The SIGTERM-and-resume scenario also reports to all four
trackers and is evaluated: the tracker tests of a 2-process run live here (tests/training/test_trackers.py has
the one-process ones), and so does the card of a resumed 2-process run.

Tolerance of "2 processes == 1 process" (dropout off, same global batch 16 = 2 x 8): the runs do
the same arithmetic in another order: the loss is the mean of two 8-row means instead of one
16-row mean, DDP sums the two ranks' gradients and halves them, and each rank pads its 8 rows to
its own longest row, which changes the matmul shapes and so the BLAS summation order. In fp32
(eps 1.2e-7) that moves a loss near 1.1 by a few ulps (measured here: at most 2.4e-7 over 20 steps,
weights at most 2.5e-7 apart). Adam divides by sqrt(v), so rounding differences in gradients near
zero can grow step by step; we allow 1e-5 (~80 ulps), 40x the measured drift. A sharding mistake
(a rank reading the other's rows, or rows twice) changes which 16 examples make a step's loss:
per-example losses at init spread by ~0.05, so the step-1 loss moves by ~1e-2, 1000x the tolerance.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import tests.trackerkit as tk
from pipeline.checks import load_config
from pipeline.cli import run_main
from pipeline.training import batching, checkpoint, trackers
from tests.accelkit import reset
from tests.training.multikit import (
    launch_two_machines,
    launch_two_processes,
    log_of,
    stop,
    train_here,
    wait_all,
    wait_for_step,
    worker_exit_codes,
    workers,
)
from tests.training.trainkit import (
    build_prepared,
    clone_prepared,
    final_weights,
    fork_launch_ranks,
    log_text,
    records,
    run_dir,
    trajectory,
)
from tests.zygote import wait_ranks

# every test that reads a scenario is slow (the scenarios start processes); the fast tier keeps the in-process
# check of how the ranks share an epoch (test_rank_shards_are_disjoint_and_cover_the_epoch)
# 160 rows, global batch 16 -> 10 steps per epoch, 20 steps in all
TRAIN = {"epochs": 2, "batch_size": 8, "lr": 3e-3, "log_every": 1, "eval_every": 0, "save_every": 4,
         "keep_last": 100, "keep_best": 1, "gradient_checkpointing": True, "group_by_length": True}
STEPS = 20
TOL = 1e-5  # see the module docstring


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    return build_prepared(root, train=TRAIN, model={"dropout": 0.1})


def _clone(base, tmp_path_factory, name: str):
    return clone_prepared(base, tmp_path_factory.mktemp(name))


def _losses(cfg) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(run_dir(cfg))]


def _ranks_log(cfg, name: str = "multi") -> str:
    """Both forked ranks' output (fork_launch_ranks: <name>-<rank>.log)."""
    return log_of(cfg, f"{name}-0") + log_of(cfg, f"{name}-1")


# ---------------------------------------------------------------- 2 processes == 1 process


@pytest.fixture(scope="module")
def equivalence(base, tmp_path_factory):
    """One process at batch 16 (no gradient checkpointing; in this process) and two at batch 8 (with it; forked
    ranks), dropout off."""
    one, two = _clone(base, tmp_path_factory, "one"), _clone(base, tmp_path_factory, "two")
    multi = fork_launch_ranks(two, "model.dropout=0.0", "train.label_audit=true")
    try:
        single = train_here(one, "model.dropout=0.0", "train.batch_size=16", "train.gradient_checkpointing=false",
                            "train.label_audit=true")
    finally:
        codes = wait_ranks(multi, timeout=300)
    assert [single, *codes] == [0, 0, 0], log_text(one)[-2000:] + _ranks_log(two)[-3000:]
    return one, two


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_global_batch(equivalence):
    one, two = equivalence
    a, b = _losses(one), _losses(two)
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, STEPS + 1))
    diffs = [abs(x - y) for (_, x), (_, y) in zip(a, b)]
    assert max(diffs) <= TOL, list(zip(range(1, STEPS + 1), diffs))
    wa, wb = final_weights(run_dir(one)), final_weights(run_dir(two))
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= TOL
    assert np.std([x for _, x in a]) > 100 * TOL  # losses vary from batch to batch far more than the tolerance


@pytest.mark.slow
def test_two_processes_give_the_label_audit_of_one(equivalence):
    """train.label_audit: each rank records its own rows, summed at the end (and in every checkpoint): every train row
    seen as often as in one process, the same AUM within the runs' tolerance, the same ranking and flags."""
    one, two = equivalence
    a, b = ([json.loads(line) for line in (run_dir(c) / "label_audit.jsonl").read_text().splitlines()] for c in (one, two))
    assert len(a) == len(b) == 160 and all(r["seen"] == 2 for r in a + b)  # 2 epochs, every row once each
    by_id = {r["id"]: r for r in b}
    assert max(abs(r["aum"] - by_id[r["id"]]["aum"]) for r in a) <= 10 * TOL
    assert [(r["id"], r["flagged"], r["most_likely"]) for r in a] == [(r["id"], r["flagged"], r["most_likely"]) for r in b]
    saved = [np.load(p / "label_audit.npz")["seen"].sum() for p, _ in checkpoint.complete_checkpoints(run_dir(two) / "checkpoints")]
    assert saved and all(n % 16 == 0 and n > 0 for n in saved)  # both ranks' rows, 16 per step


@pytest.mark.slow
def test_gradient_checkpointing_under_ddp(equivalence):
    """Non-reentrant checkpointing under DDP: no 'marked ready twice', and the same steps as without it."""
    _, two = equivalence
    log = _ranks_log(two)
    assert "2 process(es)" in log and "marked" not in log
    assert records(run_dir(two))[-1]["step"] == STEPS
    assert "gradient_checkpointing: true" in (run_dir(two) / "config.yaml").read_text()


def test_rank_shards_are_disjoint_and_cover_the_epoch():
    """The batches the loop gives each rank: disjoint, covering the epoch, and per step the same rows as
    one process at twice the batch size (the sampler the training loop uses)."""
    lengths = np.random.default_rng(0).integers(2, 40, size=203)
    for group in (True, False):
        order2 = batching.epoch_order(lengths, 42, 1, 8 * 2, group)
        order1 = batching.epoch_order(lengths, 42, 1, 16 * 1, group)
        per_epoch = len(order2)
        ranks = [list(batching.RankBatches(order2, r, 8, 0, per_epoch)) for r in (0, 1)]
        rows = [[i for b in batches for i in b] for batches in ranks]
        assert not set(rows[0]) & set(rows[1])
        assert sorted(rows[0] + rows[1]) == sorted(set(order1.ravel().tolist()))
        assert len(rows[0]) + len(rows[1]) == (203 // 16) * 16  # only the tail that fills no global batch is left
        single = list(batching.RankBatches(order1, 0, 16, 0, per_epoch))
        assert [a + b for a, b in zip(*ranks)] == single
        resumed = list(batching.RankBatches(order2, 1, 8, 5, per_epoch))  # a resume jumps straight to batch 5
        assert resumed == ranks[1][5:]


@pytest.mark.slow
def test_checkpoint_weights_are_keyed_like_the_unwrapped_model(equivalence):
    """accelerate 1.15's save_state under DDP writes model.safetensors without DDP's "module." prefix
    (what evaluation and a 1-process resume rely on); evaluation loads it through checkpoint.py."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForSequenceClassification

    _, two = equivalence
    ckpt = run_dir(two) / "checkpoints" / "step-0000020"
    with safe_open(str(ckpt / checkpoint.WEIGHTS), "pt") as f:
        keys = set(f.keys())
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(run_dir(two) / "model_config"))
    assert keys == set(model.state_dict()) and not any(k.startswith("module.") for k in keys)
    checkpoint.load_weights(ckpt, model)
    final = final_weights(run_dir(two))
    assert all(torch.equal(v, final[k]) for k, v in model.state_dict().items())


# ---------------------------------------------------------------- elastic resume: another process count


@pytest.fixture(scope="module")
def elastic(base, equivalence, tmp_path_factory):
    """Resume the 2-process run's step-8 checkpoint with 1 process at batch 16 (in this process), and the
    1-process run's with 2 processes at batch 8 (same global batch 16; forked ranks), side by side, each in a
    fresh run folder."""
    one, two = equivalence
    to_one, to_two = _clone(base, tmp_path_factory, "to_one"), _clone(base, tmp_path_factory, "to_two")
    step8 = "checkpoints/step-0000008"
    multi = fork_launch_ranks(to_two, "--resume", str(run_dir(one) / step8), "model.dropout=0.0",
                              "train.gradient_checkpointing=false")
    try:
        single = train_here(to_one, "model.dropout=0.0", "train.batch_size=16", resume=str(run_dir(two) / step8))
    finally:
        codes = wait_ranks(multi, timeout=300)
    assert [single, *codes] == [0, 0, 0], log_text(to_one)[-2000:] + _ranks_log(to_two)[-3000:]
    return to_one, to_two


@pytest.mark.slow
def test_elastic_resume_continues_the_run_with_another_process_count(equivalence, elastic):
    """2 -> 1 and 1 -> 2 processes at the same global batch: steps 9-20 equal the uninterrupted runs'
    within the fp32 summation-order tolerance of the 1-vs-2-process test (dropout off)."""
    one, two = equivalence
    for resumed, ref, log in ((elastic[0], two, log_text(elastic[0])), (elastic[1], one, _ranks_log(elastic[1]))):
        got, want = _losses(resumed), [(s, x) for s, x in _losses(ref) if s > 8]
        assert [s for s, _ in got] == [s for s, _ in want] == list(range(9, STEPS + 1))
        assert max(abs(x - y) for (_, x), (_, y) in zip(got, want)) <= TOL
        wa, wb = final_weights(run_dir(resumed)), final_weights(run_dir(ref))
        assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= TOL
        assert "resuming from" in log and "each rank restores the RNG state of saved rank" in log


@pytest.mark.slow
def test_a_changed_global_batch_is_refused_in_one_line(equivalence, tmp_path, capsys):
    """train.py's main under run_main, as its process runs it (in this one: the refusal comes before any work)."""
    from pipeline.train import main

    _, two = equivalence
    cfg = clone_prepared(two, tmp_path / "other")
    argv = ["--config", str(cfg), "--resume", str(run_dir(two) / "checkpoints" / "step-0000008"), "model.dropout=0.0"]
    capsys.readouterr()
    reset()
    try:
        with pytest.raises(SystemExit) as ended:
            run_main(lambda _: main(argv))
    finally:
        reset()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "global batch" in line]
    assert ended.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert "8 x 2 x 1 (batch_size x processes x grad_accum) = 16 in the checkpoint, 8 x 1 x 1 = 8 in this run" \
        in lines[0] and "train.batch_size=16" in lines[0]


# ---------------------------------------------------------------- two machines on one host


# the SIGTERM-and-resume run and its uninterrupted reference: validation every 5 steps (the trackers' eval/ and
# best/ scalars; the trajectories compared hold it)
EVAL = "train.eval_every=5"
TRACKERS = ["tensorboard", "mlflow", "wandb", "aim"]
REPORT = f"train.report_to={','.join(TRACKERS)}"  # on train.py's command lines only, never evaluate's


@pytest.fixture(scope="module")
def two_machines(base, tmp_path_factory):
    """The uninterrupted reference: two launchers (machine ranks 0 and 1), a checkpoint every step."""
    cfg = _clone(base, tmp_path_factory, "machines")
    codes = wait_all(launch_two_machines(cfg, "train.save_every=1", EVAL), timeout=300)
    assert codes == [0, 0], log_of(cfg, "machine0")[-3000:] + log_of(cfg, "machine1")[-3000:]
    return cfg


@pytest.mark.slow
def test_two_machine_run_logs_once_and_checkpoints_once_per_step(two_machines):
    cfg, run = two_machines, run_dir(two_machines)
    logs = log_of(cfg, "machine0") + log_of(cfg, "machine1")
    assert "2 process(es)" in logs and logs.count("finished at step 20") == 1  # only the main process reports
    assert [r["step"] for r in records(run)] == list(range(1, STEPS + 1))  # one line per step, not one per machine
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1  # the scalars: one writer
    assert len(list((run / "tensorboard").glob("*/events.out.tfevents.*"))) == 1  # the config as hparams, once
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [f"step-{s:07d}" for s in range(1, STEPS + 1)]  # no temporaries
    for path, state in checkpoint.complete_checkpoints(root):
        assert checkpoint.verify(path) is None and state["num_processes"] == 2
        assert {"rng_state_0.json", "rng_state_1.json"} <= {p.name for p in path.iterdir()}  # both machines' RNG


def _seed() -> random.Random:
    seed = int(os.environ.get("MULTI_TEST_SEED", random.randrange(1_000_000)))
    print(f"MULTI_TEST_SEED={seed}")
    return random.Random(seed)


@pytest.fixture(scope="module")
def interrupted(base, tmp_path_factory):
    """Two processes reporting to all four trackers (`accelerate launch`); SIGTERM to rank 1 only, at a seeded
    random step; then --resume auto (forked ranks); then evaluate.py's work on the test split (in this process;
    its config names no tracker).
    (It also serves the 2-process tracker tests, which had a SIGTERM-and-resume run of their own.)"""
    cfg, k = _clone(base, tmp_path_factory, "sigterm"), _seed().randint(3, STEPS - 3)
    run = run_dir(cfg)
    proc = launch_two_processes(cfg, REPORT, EVAL, log="first")
    try:
        rank1 = workers(proc, 2)[1]
        wait_for_step([proc], run, k)
        os.kill(rank1, signal.SIGTERM)
        sent = time.monotonic()
        code = wait_all([proc], timeout=120)[0]
        stopped_in = time.monotonic() - sent
    finally:
        stop(proc)
    stopped, last_logged = checkpoint.complete_checkpoints(run / "checkpoints")[-1], records(run)[-1]["step"]
    ids = json.loads((run / trackers.IDS).read_text())
    resumed = wait_ranks(fork_launch_ranks(cfg, "--resume", "auto", REPORT, EVAL, log_name="resumed"), timeout=300)
    assert resumed == [0, 0], _ranks_log(cfg, "resumed")[-3000:]
    _evaluate_here(cfg)
    return {"cfg": cfg, "k": k, "code": code, "stopped_in": stopped_in, "stopped": stopped, "last_logged": last_logged,
            "resumed": resumed, "ids_at_stop": ids}


def _evaluate_here(cfg) -> None:
    """`python pipeline/evaluate.py --config CFG --split test` in this process (nothing in it depends on a
    process of its own; trackerkit.in_process undoes what its trackers leave in it)."""
    from pipeline.evaluation.run import evaluate_checkpoint

    reset()
    try:
        with tk.in_process():
            evaluate_checkpoint(load_config(cfg, ["eval.split=test"]), str(cfg), progress=False)
    finally:
        reset()


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_all_ranks_with_a_checkpoint(interrupted):
    r, log = interrupted, log_of(interrupted["cfg"], "first")
    assert r["code"] is not None and r["stopped_in"] < 60, f"no stop within 60 s of SIGTERM:\n{log[-3000:]}"
    codes = worker_exit_codes(log)
    # the first rank to exit returns 75 ('interrupted, checkpoint saved'); torchrun then SIGTERMs the ones
    # still tearing down, and a second SIGTERM is fatal by design (signals.py), so they may read -15
    assert sorted(codes) == [0, 1] and 75 in codes.values() and set(codes.values()) <= {75, -15}, log[-3000:]
    if -15 in codes.values():
        assert "closing signal SIGTERM" in log  # it was the launcher's clean-up, after the save
    path, state = r["stopped"]
    assert state["step"] >= r["k"] and (path / "rng_state_0.json").is_file() and (path / "rng_state_1.json").is_file()
    assert checkpoint.verify(path) is None and state["step"] == r["last_logged"]  # saved where both stopped
    assert "SIGTERM received" in log and f"stopped at step {state['step']}" in log  # rank 0 agreed to stop


@pytest.mark.slow
def test_resume_under_two_processes_is_exact(interrupted, two_machines):
    """SIGTERM + --resume auto on one machine == the uninterrupted two-machine run, float for float
    (2 processes on one machine or on two, launched or forked, do the same arithmetic)."""
    cfg = interrupted["cfg"]
    assert interrupted["resumed"] == [0, 0], _ranks_log(cfg, "resumed")[-3000:]
    assert "resuming from" in _ranks_log(cfg, "resumed")
    assert trajectory(run_dir(cfg)) == trajectory(run_dir(two_machines))
    a, b = final_weights(run_dir(cfg)), final_weights(run_dir(two_machines))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- a rank that dies or hangs


def _fail_rank1(cfg, sig: int, *extra: str) -> dict:
    """Two ranks with no launcher over them (forked: as on two machines, where no launcher sees the other
    machine's worker, rank 0 has only gloo to learn its peer's fate); at step 3 send `sig` to rank 1; how does
    rank 0 end, and when."""
    ranks = fork_launch_ranks(cfg, *extra, log_name="ranks")
    try:
        wait_for_step(ranks, run_dir(cfg), 3)
        ranks[1].send_signal(sig)
        sent = time.monotonic()
        code = wait_ranks(ranks[:1], timeout=120)[0]
        return {"code": code, "after": time.monotonic() - sent, "log": log_of(cfg, "ranks-0")}
    finally:
        for rank in ranks:
            rank.kill()  # SIGKILL reaches a stopped process too


@pytest.fixture(scope="module")
def failures(base, tmp_path_factory):
    """A dead rank (SIGKILL) and a hung one (SIGSTOP, with a 20 s collective timeout), side by side. (These were
    two-machine launches; a launcher's part in them was only to report its own worker's exit: the two launchers
    of a two-machine run are two_machines', torchrun's report of a rank's exit the SIGTERM scenario's.)"""
    dead, hung = _clone(base, tmp_path_factory, "dead"), _clone(base, tmp_path_factory, "hung")
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(_fail_rank1, dead, signal.SIGKILL),
                pool.submit(_fail_rank1, hung, signal.SIGSTOP, "train.collective_timeout_s=20")]
        return {"dead": jobs[0].result(), "hung": jobs[1].result()}


@pytest.mark.slow
def test_a_dead_rank_stops_the_others_with_an_error(failures):
    r = failures["dead"]
    assert r["code"] == 1 and r["after"] < 60, r["log"][-3000:]
    assert "Connection reset by peer" in r["log"] or "Connection closed by peer" in r["log"], r["log"][-3000:]


@pytest.mark.slow
def test_a_hung_rank_stops_the_others_after_the_collective_timeout(failures):
    r = failures["hung"]
    assert r["code"] == 1, r["log"][-3000:]
    assert 15 <= r["after"] < 80  # the 20 s timeout, not gloo's default 30 minutes, and not at once
    assert "Timed out waiting 20000ms" in r["log"]


# ---------------------------------------------------------------- the trackers of a 2-process run (train.report_to)

READERS = {"mlflow": tk.mlflow_scalars, "wandb": tk.wandb_scalars, "aim": tk.aim_scalars}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(READERS))
def test_each_tracker_holds_the_runs_scalars_config_and_test_metrics(interrupted, name):
    """Every tracker, read back through its own client, holds what metrics.jsonl holds (the per-rank losses of the
    2 processes included) at their steps, the resolved config, the best metric and evaluate's figures; the resume
    continued the tracker runs the first launch opened; evaluate, whose config names no tracker, reported into
    the run's trackers (trackers.json): the property test_trackers.py's
    test_evaluate_reports_into_the_trackers_the_run_used_whatever_its_command_line checked with a run of its own."""
    cfg, run = interrupted["cfg"], run_dir(interrupted["cfg"])
    ids = json.loads((run / trackers.IDS).read_text())
    assert ids == interrupted["ids_at_stop"], "the resume opened new tracker runs instead of continuing the first"
    scalars, params, runs = READERS[name](run, ids[name])
    expected = tk.expected_scalars(run)
    assert {"train/loss_rank_0", "train/loss_rank_1", "eval/accuracy", "train/lr"} <= set(expected)
    assert sorted(expected["train/loss"]) == list(range(1, STEPS + 1)) and sorted(expected["eval/loss"]) == [5, 10, 15, 20]
    for key, by_step in expected.items():  # the last value per step: a resume logs its redone steps again, equal
        assert scalars[key] == by_step, f"{name}: {key}"
    best = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"finished"' in line][-1]["best"]
    assert scalars[f"best/{best['metric']}"] == {STEPS: best["value"]} and scalars["best/step"] == {STEPS: best["step"]}
    test = json.loads((run / "eval" / "test-final" / "metrics.json").read_text())
    assert scalars["test/chunk/accuracy"] == {STEPS: test["chunk"]["accuracy"]}
    assert scalars["test/document/per_class/negative/f1"] == {STEPS: test["document"]["per_class"]["negative"]["f1"]}
    flat = trackers.params(load_config(cfg, [REPORT, EVAL]))  # the resolved config, every key, as the first launch had it
    assert flat["train.lr"] == 3e-3 and flat["train.report_to"] == json.dumps(TRACKERS)
    if name == "mlflow":  # MLflow keeps parameters as text
        assert params == {k: str(v) for k, v in flat.items()} and runs == 1
    else:
        assert params == flat
        # aim: one run; wandb offline: one folder per launch of the same run id (train, resume, evaluate)
        assert runs == (1 if name == "aim" else 3)


@pytest.mark.slow
def test_tensorboard_receives_the_same_scalars(interrupted):
    run = run_dir(interrupted["cfg"])
    got, expected = tk.tensorboard_scalars(run), tk.expected_scalars(run)
    assert {"train/loss_rank_0", "train/loss_rank_1", "eval/accuracy"} <= set(expected)
    for key, by_step in expected.items():  # event files hold float32
        assert got[key].keys() == by_step.keys(), key
        assert all(math.isclose(got[key][s], v, rel_tol=1e-6, abs_tol=1e-30) for s, v in by_step.items()), key


@pytest.mark.slow
def test_the_card_of_a_resumed_2_process_run_says_so_and_holds_evaluates_figures(interrupted):
    from huggingface_hub import ModelCard

    run = run_dir(interrupted["cfg"])
    card = ModelCard.load(run / "final" / "README.md")
    assert "| batch | 8 x 2 process(es) x 1 accumulation = 16 examples per step |" in card.text
    assert "| launches | 2 (resumed 1 time(s)) |" in card.text and f"| steps | {STEPS} (epoch " in card.text
    test = json.loads((run / "eval" / "test-final" / "metrics.json").read_text())
    got = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert got[("test", "accuracy")] == test["document"]["accuracy"] and test["processes"] == 1
