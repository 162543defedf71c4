"""Resume is identical to never stopping: real train.py processes killed with real signals at seeded
random steps (set RESUME_TEST_SEED to replay a failure), crashed inside checkpoint saves, stopped by
SIGTERM or Ctrl-C, halted by NaN losses, then resumed; per-step losses and final weights compared with
`==` to an uninterrupted run that trains alongside.

One chain of processes per variant, on one run folder: the plain classifier takes the whole matrix (a NaN
halt, a SIGKILL at a random step, a SIGKILL inside a save at each crash point, a SIGTERM at a random step);
the other variants (causal_lm, LoRA on each task) one interruption and one crash inside a save each, enough
to prove their checkpoints resume exactly once the matrix holds for the plain model. The processes are forked
from a zygote that has done the imports (trainkit.fork_launch: real processes, ~6 s of CPU less each); the
classifier's uninterrupted run is started by `accelerate launch` (fresh processes), so its equality also holds
between the two kinds of process. The in-process member of this property, in the fast tier: test_loop.py's
test_an_in_process_stop_and_resume_equals_the_uninterrupted_run."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
import yaml

from pipeline.accel import cpu_has_native_bf16
from pipeline.training import checkpoint
from tests.training.trainkit import (
    build_prepared,
    build_prepared_instruct,
    build_prepared_lm,
    clone_prepared,
    final_weights,
    fork_launch,
    log_text,
    records,
    run_dir,
    trajectory,
    wait_for_step,
    with_pretrained_base,
)

pytestmark = pytest.mark.slow

# 160 rows / batch 8 = 20 micro-batches = 10 steps per epoch at grad_accum 2; 30 steps in all. Checkpoints at
# steps 4, 8, 10 (epoch end), 12, 16, 20, ...; validation at 10, 20, 30. A NaN from forward pass 17 on is a NaN
# at step 9 on: steps 9-11 skipped, the run halts at 11 (3 in a row) naming step 8's checkpoint (step 10's, saved
# at the epoch's end mid-streak, is not healthy).
SCENARIO = {"train": {"epochs": 3, "grad_accum": 2, "save_every": 4, "eval_every": 10, "lr": 5e-3,
                      "group_by_length": True, "keep_last": 2, "keep_best": 1, "nan_policy": "skip",
                      "max_nan_in_a_row": 3},
            "model": {"dropout": 0.1}}
NAN_FROM = 17


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """configs(tmp_path, names, task="classification", lora=False, train={...}) -> one config per name, each its
    own output_dir on one prepared dataset per task (made once for this file, copied: the same bytes). causal_lm:
    173 blocks of 16 tokens from 56 documents (10 steps per epoch as well), built by the real prepare stages. lora:
    adapters (and the classifier's head) trained on the tiny model saved as a pretrained base
    (trainkit.with_pretrained_base), once per task."""
    root, bases = tmp_path_factory.mktemp("bases"), {}

    def base(task: str, lora: bool):
        if (task, lora) not in bases:
            if lora:
                bases[task, lora] = with_pretrained_base(clone_prepared(base(task, False), root / f"{task}-lora"))
            elif task in ("causal_lm", "instruct"):
                (root / task).mkdir()
                build = build_prepared_lm if task == "causal_lm" else build_prepared_instruct
                bases[task, lora] = build(root / task, train={**SCENARIO["train"], "group_by_length": False},
                                          model=SCENARIO["model"])
            else:
                (root / task).mkdir()
                bases[task, lora] = build_prepared(root / task, train=SCENARIO["train"], model=SCENARIO["model"])
        return bases[task, lora]

    def make(tmp_path, names, task: str = "classification", lora: bool = False, train: dict | None = None) -> list:
        out = []
        for name in names:
            cfg = clone_prepared(base(task, lora), tmp_path / name)
            tree = yaml.safe_load(cfg.read_text(encoding="utf-8"))
            tree["train"].update(train or {})
            cfg.write_text(yaml.safe_dump(tree), encoding="utf-8")
            out.append(cfg)
        return out

    return make


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


class Chain:
    """The interrupted run: one process after another on one run folder, each log kept (proc-N.log)."""

    def __init__(self, cfg):
        self.cfg, self.run, self.n = cfg, run_dir(cfg), 0

    def _start(self, *extra, **kw):
        self.n += 1
        self.log = f"proc-{self.n}"
        return fork_launch(self.cfg, *extra, log_name=self.log, **kw)

    def text(self) -> str:
        return log_text(self.cfg, self.log)

    def kill_at(self, step: int, sig: int, *resume: str) -> int:
        """Launch (resuming as `resume` says), wait until `step` is logged by *this* process, send `sig`;
        return the exit code."""
        old = _inode(self.run)
        proc = self._start(*resume)
        try:
            reached = False
            while not reached:
                reached = wait_for_step(proc, self.run, step) and _inode(self.run) != old
                time.sleep(0.01)
                assert proc.poll() is None, f"finished before step {step}:\n{self.text()[-3000:]}"
            proc.send_signal(sig)
            return proc.wait(timeout=120)
        finally:
            proc.kill()

    def crash_in_save(self, point: str, nth: int) -> None:
        """--resume auto, SIGKILLed inside its nth checkpoint save at `point` (crash_in_save.py)."""
        rc = self._start("--resume", "auto", crash=(point, nth)).wait(timeout=180)
        assert rc == -signal.SIGKILL, f"{point}: rc {rc}\n{self.text()[-3000:]}"
        assert f"SIGKILL at {point}" in self.text()
        _assert_intact(self.run)

    def nan_halt(self) -> None:
        """A fresh process whose loss is NaN from step 9 on: exit 65 naming step 8's checkpoint."""
        assert self._start(nan_from=NAN_FROM).wait(timeout=180) == 65, self.text()[-3000:]
        healthy = self.run / "checkpoints" / "step-0000008"
        log = self.text()
        assert "3 in a row (train.max_nan_in_a_row)" in log and f"last healthy checkpoint: {healthy}" in log, log[-3000:]
        events = [r for r in records(self.run, "all") if r.get("event") == "nonfinite"]
        assert [(e["step"], e["in_a_row"]) for e in events] == [(9, 1), (10, 2), (11, 3)]
        unhealthy = checkpoint.complete_checkpoints(self.run / "checkpoints")[-1][1]
        assert unhealthy["step"] == 10 and unhealthy["nan"]["in_a_row"] == 2

    def finish(self) -> None:
        proc = self._start("--resume", "auto")
        assert proc.wait(timeout=180) == 0, self.text()[-3000:]


def _assert_same_run(ref_run, run) -> None:
    got, want = trajectory(run), trajectory(ref_run)
    assert [g[0] for g in got if isinstance(g[0], int)] == [w[0] for w in want if isinstance(w[0], int)]
    assert got == want  # exact floats: loss, lr, grad norm and eval metrics at every step
    a, b = final_weights(run), final_weights(ref_run)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _accelerate_launch(config):
    """`accelerate launch --config_file accelerate_config.yaml pipeline/train.py --config CONFIG`: fresh processes
    (the launcher, and train.py it starts), output to <config folder>/proc.log."""
    import subprocess
    import sys

    from tests.training.trainkit import REPO
    from tests.zygote import child_env

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_config.yaml"),
           str(REPO / "pipeline" / "train.py"), "--config", str(config)]
    return subprocess.Popen(cmd, stdout=open(config.parent / "proc.log", "w"), stderr=subprocess.STDOUT, env=child_env(),
                            cwd=REPO)


def _healthy(run) -> str:
    return str(run / "checkpoints" / "step-0000008")


def test_the_whole_kill_matrix_on_a_classifier_equals_the_uninterrupted_run(tmp_path, configs):
    """NaN halt, resume from the named checkpoint, SIGKILL at a random step, SIGKILL inside a save after the
    weights / before the rename (manifest written) / during rotation, SIGTERM at a random step (exit 75 and a
    checkpoint at that step), the last resume: the run equals the one never interrupted, with <= 3 checkpoints, and
    so does its label audit (train.label_audit on both).
    The uninterrupted run is started by `accelerate launch` (fresh processes, not forked). Also guards what
    test_kill_chain_equals_uninterrupted_run[classification] (two chains: SIGKILL, SIGKILL, SIGTERM; and the
    three crash points), test_a_nan_halt_..._never_met_it[classification] and test_signals.py's
    test_accelerate_launch_runs_train_py (it trains and exports: "1 process(es), precision no") guarded."""
    rng = _seed()
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), train={"label_audit": True})
    ref = _accelerate_launch(ref_cfg)  # the uninterrupted run, alongside, as the README starts one
    chain = Chain(cfg)
    chain.nan_halt()
    # resumed from the named checkpoint, it redoes step 10's checkpoint (healthy now) before the kill at 11-15
    assert chain.kill_at(rng.randint(11, 15), signal.SIGKILL, "--resume", _healthy(chain.run)) == -signal.SIGKILL
    assert "resuming from" in chain.text() and not checkpoint.complete_checkpoints(chain.run / "checkpoints")[-1][1]["nan"]["in_a_row"]
    _assert_intact(chain.run)
    for point in ("weights", "before_rename", "rotation"):
        chain.crash_in_save(point, 1)
    k = max(_newest_step(chain.run) + 2, rng.randint(21, 27))
    assert chain.kill_at(k, signal.SIGTERM, "--resume", "auto") == 75
    stopped = checkpoint.complete_checkpoints(chain.run / "checkpoints")[-1][1]
    assert stopped["step"] >= k and stopped["step"] == max(r[0] for r in trajectory(chain.run) if isinstance(r[0], int))
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    assert "1 process(es), precision no" in log_text(ref_cfg)
    _assert_same_run(run_dir(ref_cfg), chain.run)
    kept = checkpoint.complete_checkpoints(chain.run / "checkpoints")
    assert kept[-1][1]["step"] == 30 and len(kept) <= 3  # keep_last 2 + keep_best 1
    # train.label_audit: the record rode through every checkpoint; the report is the uninterrupted run's, byte for byte
    assert (chain.run / "label_audit.jsonl").read_bytes() == (run_dir(ref_cfg) / "label_audit.jsonl").read_bytes()


def test_a_causal_lm_run_halted_by_nan_killed_and_crashed_in_a_save_equals_the_uninterrupted_run(tmp_path, configs):
    """causal_lm (packed blocks, token-weighted losses): NaN halt, resume from the named checkpoint, SIGKILL at
    a random step, SIGKILL inside a save after the weights, the last resume. Also guards what
    test_kill_chain_equals_uninterrupted_run[causal_lm] and test_a_nan_halt_..._never_met_it[causal_lm] guarded
    (the kill matrix itself: the classifier's test above)."""
    rng = _seed()
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), "causal_lm")
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    chain.nan_halt()
    assert chain.kill_at(rng.randint(11, 19), signal.SIGKILL, "--resume", _healthy(chain.run)) == -signal.SIGKILL
    chain.crash_in_save("weights", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), chain.run)


def test_a_bf16_lora_classifier_stopped_by_ctrl_c_and_crashed_in_a_save_equals_the_uninterrupted_run(tmp_path, configs):
    """LoRA (checkpoints of the adapters and head only) in bf16 autocast, 2 epochs: Ctrl-C at a random step
    (save, exit 75), SIGKILL inside a save before its rename, the last resume. Also guards what
    test_bf16_ctrl_c_resume_equals_uninterrupted_run and test_kill_chain_equals_uninterrupted_run
    [classification-lora] guarded, and test_lora.py's test_bf16_autocast_with_lora (bf16 trains a LoRA model:
    precision bf16 said, adapter tensors in its checkpoints)."""
    rng = _seed()
    bf16 = {"epochs": 2, "mixed_precision": "bf16", "allow_slow_bf16": True}
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), lora=True, train=bf16)
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    assert chain.kill_at(rng.randint(5, 15), signal.SIGINT) == 75  # Ctrl-C: save, exit 75
    assert "precision bf16" in chain.text()
    newest = checkpoint.complete_checkpoints(chain.run / "checkpoints")[-1][0]
    from safetensors.torch import load_file

    saved = load_file(str(newest / "model.safetensors"))
    assert saved and all(".lora_" in k or ".modules_to_save." in k for k in saved), sorted(saved)[:5]
    chain.crash_in_save("before_rename", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    # the warning banner is for CPUs that emulate bf16; one with native bf16 runs it silently
    assert ("WARNING: bf16 forced" in log_text(ref_cfg)) is not cpu_has_native_bf16()
    _assert_same_run(run_dir(ref_cfg), chain.run)


def test_a_lora_causal_lm_killed_and_crashed_in_a_save_equals_the_uninterrupted_run(tmp_path, configs):
    """LoRA on the causal LM, 2 epochs: SIGKILL at a random step of a fresh run (started with --resume auto, which
    finds nothing and starts fresh), SIGKILL inside a save after the weights (the adapters' file written, the
    optimizer not yet), the last resume. Also guards what test_kill_chain_equals_uninterrupted_run[causal_lm-lora]
    guarded, and the old crash chains' first launch (--resume auto on an empty run folder)."""
    rng = _seed()
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), "causal_lm", lora=True, train={"epochs": 2})
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    assert chain.kill_at(rng.randint(5, 15), signal.SIGKILL, "--resume", "auto") == -signal.SIGKILL
    assert f"--resume auto: no complete checkpoint in {chain.run / 'checkpoints'}; starting fresh" in chain.text()
    _assert_intact(chain.run)
    chain.crash_in_save("weights", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), chain.run)


def test_an_instruct_run_killed_and_crashed_in_a_save_equals_the_uninterrupted_run(tmp_path, configs):
    """task=instruct (conversations through the chat template, the loss on the answers' tokens alone, answers
    sampled at each validation) as causal_lm is above: SIGKILL at a random step, SIGKILL inside a save after the
    weights, the last resume; the losses, validations and final weights those of the run that never stopped."""
    rng = _seed()
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), "instruct")
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    assert chain.kill_at(rng.randint(5, 25), signal.SIGKILL) == -signal.SIGKILL
    _assert_intact(chain.run)
    chain.crash_in_save("weights", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), chain.run)
    assert sorted(p.name for p in (chain.run / "samples").iterdir()) == \
        sorted(p.name for p in (run_dir(ref_cfg) / "samples").iterdir())  # the answers at each validation


@pytest.mark.parametrize(("name", "lr"), [("adafactor", 1e-2), ("sgd", 5e-2), ("lion", 1e-4)])
def test_each_optimizer_killed_and_resumed_equals_the_uninterrupted_run(tmp_path, configs, name, lr):
    """train.optimizer (AdamW: every test above): SIGKILL at a random step, SIGKILL inside a save after the
    weights (the optimizer's state not yet written), the last resume; equal to the run that never stopped."""
    rng = _seed()
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), train={"optimizer": name, "lr": lr, "epochs": 2})
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    assert chain.kill_at(rng.randint(5, 15), signal.SIGKILL) == -signal.SIGKILL
    chain.crash_in_save("weights", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), chain.run)


def test_an_early_stopped_run_killed_between_validations_stops_at_the_same_step_with_the_same_final(tmp_path, configs):
    """train.early_stopping_patience (its counter is part of state.json): validations every 4 steps, patience 2
    and a delta no validation can beat, so the run stops at step 12 with the best validation's model; a SIGKILL
    between validations and a SIGKILL inside a save, then --resume auto, stop at the same step with the same
    final/ weights as the run never killed."""
    rng = _seed()
    es = {"eval_every": 4, "early_stopping_patience": 2, "early_stopping_delta": 1.0}
    ref_cfg, cfg = configs(tmp_path, ("ref", "chain"), train=es)
    ref = fork_launch(ref_cfg)
    chain = Chain(cfg)
    assert chain.kill_at(rng.choice([5, 6, 7, 9, 10, 11]), signal.SIGKILL) == -signal.SIGKILL
    chain.crash_in_save("weights", 1)
    chain.finish()
    assert ref.wait(timeout=180) == 0, log_text(ref_cfg)[-3000:]
    _assert_same_run(run_dir(ref_cfg), chain.run)
    for run in (run_dir(ref_cfg), chain.run):
        stopped = [r for r in records(run, "all") if r.get("event") == "early_stopped"]
        assert [r["stopped_at"] for r in stopped][-1] == 12, run
    assert "early stopping at step 12" in chain.text()
