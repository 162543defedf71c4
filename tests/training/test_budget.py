"""train.max_minutes: the plan's arithmetic by hand, and a real budget run whose step count is
measured once, stored, and kept by a resume (no assertion on how long anything took)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from pipeline import artifacts
from pipeline.checks import load_config
from pipeline.training import budget, checkpoint, signals
from pipeline.training.loop import train
from tests.training.trainkit import clone_prepared, records, run_dir, trajectory


def _t(eval_every=0, save_every=0, save_at_epoch_end=False):
    return SimpleNamespace(eval_every=eval_every, save_every=save_every, save_at_epoch_end=save_at_epoch_end)


def test_events_count_every_kth_step_and_the_last_once():
    assert budget.events(10, 0) == 1  # only at the end
    assert budget.events(10, 5) == 2 and budget.events(11, 5) == 3  # 5, 10 / 5, 10, 11
    assert budget.events(12, 4, 6) == 4  # 4, 6, 8, 12 (12 is both, counted once, and it is the last)
    assert budget.events(13, 4, 6) == 5  # 4, 6, 8, 12, and the last step 13


def test_plan_is_the_largest_step_count_that_fits():
    c = budget.Costs(step=1.0, validation=10.0, checkpoint=2.0, export=1.0)
    t = _t(eval_every=50, save_every=25)
    # n=100: 100 steps + 2 validations + 4 checkpoints + export = 100 + 20 + 8 + 1 = 129 s
    assert budget.run_seconds(100, c, t, steps_per_epoch=1000) == 129.0
    assert budget.plan_steps(129.0, c, t, 1000, cap=10_000) == 100
    # 101 would add a step, a validation and a checkpoint at the end: 101 + 30 + 10 + 1 = 142 s
    assert budget.plan_steps(141.9, c, t, 1000, cap=10_000) == 100
    assert budget.plan_steps(1e9, c, t, 1000, cap=300) == 300  # never beyond what the config asks for
    assert budget.plan_steps(13.9, c, t, 1000, cap=300) == 0  # 1 step + validation + checkpoint + export = 14 s
    assert budget.plan_steps(14.0, c, t, 1000, cap=300) == 1
    epochs = _t(save_at_epoch_end=True)  # checkpoints at each epoch end (every 30 steps) and the last
    assert budget.run_seconds(60, c, epochs, steps_per_epoch=30) == 60 + 10 + 2 * 2 + 1


def _cfg(config, **train):
    return load_config(config, [f"train.{k}={v}" for k, v in train.items()])


def _fixed_costs(monkeypatch, seen: list):
    """The real measurement runs (its probe steps must leave no trace), then costs this test chose:
    the plan no longer depends on how busy the machine is. 30 s a step in a 10-minute budget: with
    setup's few seconds, about 19 steps, while the real steps take milliseconds."""
    real = budget.measure

    def measure(s):
        seen.append(real(s))
        return budget.Costs(step=30.0, validation=1.0, checkpoint=0.5, export=0.5)

    monkeypatch.setattr(budget, "measure", measure)


def test_a_budget_run_stores_its_step_count_and_a_resume_keeps_it(prepared, fresh_accelerate, capsys, monkeypatch):
    seen = []
    _fixed_costs(monkeypatch, seen)
    # 20 steps per epoch and up to 50 epochs: the budget, not the data, decides where it ends
    config = prepared(train={"epochs": 50, "save_every": 5, "keep_last": 1000, "eval_every": 0})
    assert train(_cfg(config, max_minutes=10), str(config)) == signals.EXIT_OK
    out = capsys.readouterr().out
    run = run_dir(config)
    plan = json.loads((run / "run_info.json").read_text())["launches"][0]["budget"]
    n = plan["total_steps"]
    assert 13 <= n <= 19 and plan["max_minutes"] == 10 and not plan["capped"]
    real = seen[0]
    assert real.step > 0 and real.validation > 0 and real.checkpoint > 0 and real.export > 0
    assert f"-> {n} steps" in out and f"a resume keeps {n} steps" in out
    assert records(run)[-1]["step"] == n
    states = [s for _, s in checkpoint.complete_checkpoints(run / "checkpoints")]
    assert {s["total_steps"] for s in states} == {n}  # every checkpoint carries the budget's count
    assert not list(run.glob(".budget-probe*"))  # the write probe leaves nothing behind
    # the probe steps left no trace: the run is the one max_steps=n makes, step for step
    other = clone_prepared(config, config.parent / "plain")
    capsys.readouterr()
    assert train(_cfg(other, max_steps=n), str(other)) == signals.EXIT_OK
    assert trajectory(run_dir(other)) == trajectory(run)
    # resume from a middle checkpoint with another budget: the first launch's count stands
    middle = next(p for p, s in checkpoint.complete_checkpoints(run / "checkpoints") if s["step"] == 10)
    before = trajectory(run)
    shutil.rmtree(run / "final")
    for p, s in checkpoint.complete_checkpoints(run / "checkpoints"):
        if s["step"] > 10:
            shutil.rmtree(p)
    assert train(_cfg(config, max_minutes=0.01), str(config), resume=str(middle)) == signals.EXIT_OK
    assert f"resuming with the {n} steps fixed at the first launch" in capsys.readouterr().out
    assert len(seen) == 1  # nothing measured again
    launches = json.loads((run / "run_info.json").read_text())["launches"]
    assert launches[1]["budget"]["total_steps"] == n and "measured_seconds" not in launches[1]["budget"]
    assert trajectory(run) == before  # same steps, same schedule, same losses
    assert json.loads((run / "final" / "state.json").read_text())["step"] == n
    # resumed without train.max_minutes at all: the budget still stands (it ran 565 steps instead of 448)
    shutil.rmtree(run / "final")
    for p, s in checkpoint.complete_checkpoints(run / "checkpoints"):
        if s["step"] > 10:
            shutil.rmtree(p)
    assert train(_cfg(config, max_minutes=0), str(config), resume=str(middle)) == signals.EXIT_OK
    assert f"time budget train.max_minutes=10: resuming with the {n} steps fixed at the first launch" \
        in capsys.readouterr().out
    assert len(seen) == 1 and trajectory(run) == before
    assert json.loads((run / "final" / "state.json").read_text())["step"] == n


@pytest.mark.slow
def test_a_budget_run_on_onnxruntime_exports_in_setup_and_its_validations_export_nothing(prepared, fresh_accelerate,
                                                                                         monkeypatch):
    """Issue 23: the budget counted an export per validation, and every validation made one. Now the run's
    graph is exported in setup (the measurement builds the template) and each validation only puts the
    weights in: no TorchScript export after setup."""
    pytest.importorskip("onnxruntime")
    from pipeline.inference import onnx_export, onnx_template

    traced, at_setup = [], []
    real_export, real_measure = onnx_export._export_torch, budget.measure

    def export_torch(*args, **kwargs):
        traced.append(1)
        return real_export(*args, **kwargs)

    def measure(s):
        costs = real_measure(s)
        at_setup.append((len(traced), costs))
        return costs

    monkeypatch.setattr(onnx_export, "_export_torch", export_torch)
    monkeypatch.setattr(budget, "measure", measure)
    config = prepared(train={"max_steps": 6, "eval_every": 2, "save_every": 0})
    cfg = load_config(config, ["train.max_minutes=30", "eval.runtime=onnxruntime", "eval.precision=int8"])
    assert train(cfg, str(config)) == signals.EXIT_OK
    [(setup_traces, costs)] = at_setup
    # the template's two probes; the untrained model's equal tensors (LayerNorm ones, zero biases) make the
    # measurement's two validations full exports
    assert setup_traces == 4 and costs.validation > 0
    assert len(traced) == setup_traces  # validations at steps 2, 4, 6: the weights put in, nothing exported
    run = run_dir(config)
    assert [r["step"] for r in records(run, "eval")] == [2, 4, 6]
    [template] = (run / ".onnx").glob(f"{onnx_template.PREFIX}*")
    assert artifacts.check_files(template) is None and not list(run.glob(".onnx-export.tmp-*"))


def test_a_budget_too_small_for_one_step_is_one_clear_error(prepared, fresh_accelerate):
    config = prepared(train={"epochs": 50})
    with pytest.raises(ValueError, match=r"train.max_minutes=0.001 leaves no time to train: setup took .* raise train"):
        train(_cfg(config, max_minutes=0.001), str(config))
