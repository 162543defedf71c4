"""Resume is identical to never stopping: real train.py processes killed with real signals at seeded
random steps (set RESUME_TEST_SEED to replay a failure), crashed inside checkpoint saves, stopped by
SIGTERM, then resumed; per-step losses and final weights compared with `==` to an uninterrupted
run that trains alongside."""

from __future__ import annotations

import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from pipeline.accel import cpu_has_native_bf16
from pipeline.training import checkpoint
from tests.training.trainkit import (
    build_prepared,
    build_prepared_lm,
    clone_prepared,
    final_weights,
    launch,
    log_text,
    records,
    run_dir,
    trajectory,
    wait_for_step,
    with_pretrained_base,
)

pytestmark = pytest.mark.slow

# 160 rows / batch 8 = 20 micro-batches = 10 steps per epoch at grad_accum 2; 30 steps in all.
SCENARIO = {"train": {"epochs": 3, "grad_accum": 2, "save_every": 4, "eval_every": 10, "lr": 5e-3,
                      "group_by_length": True, "keep_last": 2, "keep_best": 1},
            "model": {"dropout": 0.1}}


def _configs(tmp_path, names, task: str = "classification", lora: bool = False, **over) -> list:
    """One prepared dataset, cloned under one output_dir per name. causal_lm: 173 blocks of 16 tokens from
    56 documents (10 steps per epoch as well), built by the real prepare stages. lora: adapters (and the
    classifier's head) trained on the tiny model saved as a pretrained base (trainkit.with_pretrained_base)."""
    (tmp_path / "base").mkdir()
    train = {**SCENARIO["train"], **over.pop("train", {})}
    if task == "causal_lm":
        base = build_prepared_lm(tmp_path / "base", train={**train, "group_by_length": False}, model=SCENARIO["model"])
    else:
        base = build_prepared(tmp_path / "base", train=train, model=SCENARIO["model"], **over)
    if lora:
        with_pretrained_base(base)
    return [clone_prepared(base, tmp_path / n) for n in names]


def _seed() -> random.Random:
    seed = int(os.environ.get("RESUME_TEST_SEED", random.randrange(1_000_000)))
    print(f"RESUME_TEST_SEED={seed}")
    return random.Random(seed)


def _inode(run) -> int | None:
    p = run / "metrics.jsonl"
    return p.stat().st_ino if p.exists() else None


def _newest_step(run) -> int:
    path, _ = checkpoint.find_resume(run / "checkpoints")
    return checkpoint.complete_checkpoints(run / "checkpoints")[-1][1]["step"] if path else 0


def _assert_intact(run) -> None:
    """Whatever the kill left, no checkpoint that looks complete is corrupt."""
    _, warnings = checkpoint.find_resume(run / "checkpoints")
    assert not [w for w in warnings if "corrupt" in w], warnings


def _kill_at(cfg, run, step: int, sig: int, resume: bool) -> int:
    """Launch, wait until `step` is logged by *this* process, send `sig`; return the exit code."""
    old = _inode(run)
    proc = launch(cfg, *(["--resume", "auto"] if resume else []))
    try:
        reached = False
        while not reached:
            reached = wait_for_step(proc, run, step) and _inode(run) != old
            time.sleep(0.01)
            assert proc.poll() is None, f"finished before step {step}:\n{log_text(cfg)[-3000:]}"
        proc.send_signal(sig)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def _crash_in_save(cfg, run, point: str, nth: int) -> None:
    proc = launch(cfg, "--resume", "auto", crash=(point, nth))
    rc = proc.wait(timeout=180)
    assert rc == -signal.SIGKILL, f"{point}: rc {rc}\n{log_text(cfg)[-3000:]}"
    _assert_intact(run)


def _assert_same_run(ref_run, run) -> None:
    got, want = trajectory(run), trajectory(ref_run)
    assert [g[0] for g in got if isinstance(g[0], int)] == [w[0] for w in want if isinstance(w[0], int)]
    assert got == want  # exact floats: loss, lr, grad norm and eval metrics at every step
    a, b = final_weights(run), final_weights(ref_run)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _signal_chain(cfg, k1: int, k2: int, k3: int) -> None:
    """SIGKILL in epoch 0, SIGKILL in epoch 1, SIGTERM in epoch 2 (exit 75, checkpoint at that step)."""
    run = run_dir(cfg)
    assert _kill_at(cfg, run, k1, signal.SIGKILL, resume=False) == -signal.SIGKILL
    _assert_intact(run)
    assert _kill_at(cfg, run, max(_newest_step(run) + 2, k2), signal.SIGKILL, resume=True) == -signal.SIGKILL
    k3 = max(_newest_step(run) + 2, k3)
    assert _kill_at(cfg, run, k3, signal.SIGTERM, resume=True) == 75
    stopped = checkpoint.complete_checkpoints(run / "checkpoints")[-1][1]
    assert stopped["step"] >= k3 and stopped["step"] == max(r[0] for r in trajectory(run) if isinstance(r[0], int))


def _crash_chain(cfg) -> None:
    """SIGKILL inside saves: after the weights, before the rename (manifest written), during rotation."""
    for point, nth in (("weights", 2), ("before_rename", 1), ("rotation", 2)):
        _crash_in_save(cfg, run_dir(cfg), point, nth)


@pytest.mark.parametrize("task,lora", [("classification", False), ("causal_lm", False), ("classification", True),
                                       ("causal_lm", True)], ids=["classification", "causal_lm", "classification-lora",
                                                                  "causal_lm-lora"])
def test_kill_chain_equals_uninterrupted_run(tmp_path, task, lora):
    rng = _seed()
    ks = rng.randint(5, 9), rng.randint(12, 19), rng.randint(21, 27)
    ref_cfg, sig_cfg, crash_cfg = _configs(tmp_path, ("ref", "signals", "crashes"), task, lora)
    ref = launch(ref_cfg)  # the uninterrupted run, alongside the two interrupted ones
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(_signal_chain, sig_cfg, *ks), pool.submit(_crash_chain, crash_cfg)]
        for job in jobs:
            job.result()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    for cfg in (sig_cfg, crash_cfg):
        last = launch(cfg, "--resume", "auto", log_name="last")
        assert last.wait(timeout=180) == 0, log_text(cfg, "last")[-3000:]
        _assert_same_run(run_dir(ref_cfg), run_dir(cfg))
        kept = checkpoint.complete_checkpoints(run_dir(cfg) / "checkpoints")
        assert kept[-1][1]["step"] == 30 and len(kept) <= 3  # keep_last 2 + keep_best 1


def test_bf16_ctrl_c_resume_equals_uninterrupted_run(tmp_path):
    rng = _seed()
    over = {"train": {"epochs": 2, "mixed_precision": "bf16", "allow_slow_bf16": True}}
    ref_cfg, cfg = _configs(tmp_path, ("ref", "chain"), **over)
    ref = launch(ref_cfg)
    run = run_dir(cfg)
    assert _kill_at(cfg, run, rng.randint(9, 15), signal.SIGINT, resume=False) == 75  # Ctrl-C: save, exit 75
    last = launch(cfg, "--resume", "auto", log_name="last")
    assert last.wait(timeout=180) == 0, log_text(cfg, "last")[-3000:]
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    # the warning banner is for CPUs that emulate bf16; one with native bf16 runs it silently
    assert ("WARNING: bf16 forced" in log_text(ref_cfg)) is not cpu_has_native_bf16()
    _assert_same_run(run_dir(ref_cfg), run)


@pytest.mark.parametrize("task", ["classification", "causal_lm"])
def test_a_nan_halt_names_the_checkpoint_whose_resume_equals_the_run_that_never_met_it(tmp_path, task):
    """Every loss NaN from step 9 on (forward pass 17 at grad_accum 2): steps 9-11 are skipped, the run halts
    (exit 65) naming step-8's checkpoint (step 10's, saved at the epoch's end mid-streak, is not healthy);
    resumed from it once the cause is gone, the run equals the one that never met a NaN."""
    ref_cfg, cfg = _configs(tmp_path, ("ref", "nan"), task, train={"nan_policy": "skip", "max_nan_in_a_row": 3})
    ref = launch(ref_cfg)
    run = run_dir(cfg)
    assert launch(cfg, nan_from=17).wait(timeout=180) == 65, log_text(cfg)[-3000:]
    healthy = run / "checkpoints" / "step-0000008"
    log = log_text(cfg)
    assert "3 in a row (train.max_nan_in_a_row)" in log and f"last healthy checkpoint: {healthy}" in log, log[-3000:]
    events = [r for r in records(run, "all") if r.get("event") == "nonfinite"]
    assert [(e["step"], e["in_a_row"]) for e in events] == [(9, 1), (10, 2), (11, 3)]
    last = launch(cfg, "--resume", str(healthy), log_name="last")
    assert last.wait(timeout=180) == 0, log_text(cfg, "last")[-3000:]
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), run)
