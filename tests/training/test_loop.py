"""The loop in-process on the toy task: it learns, logs the named scalars, rotates checkpoints,
exports a model that `pipeline()` loads, and handles non-finite losses by policy."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.training import build, checkpoint, signals
from pipeline.training.loop import train
from tests.training.trainkit import LABELS, clone_prepared, records, run_dir

SCALARS = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/samples_per_s",
           "train/padding_fraction", "eval/loss", "eval/accuracy", "eval/macro_f1"}


def _scalars(run) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for d in {p.parent for p in (run / "tensorboard").rglob("events.out.tfevents.*")}:
        acc = EventAccumulator(str(d))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def test_tiny_model_learns_logs_rotates_and_exports(prepared, fresh_accelerate, capsys):
    config = prepared(train={"epochs": 3, "lr": 5e-3, "save_every": 5, "eval_every": 10})
    cfg = load_config(config)
    assert train(cfg, str(config)) == signals.EXIT_OK
    run = run_dir(config)
    losses = [r["loss"] for r in records(run)]
    assert len(losses) == 60 and sum(losses[-10:]) / 10 < sum(losses[:5]) / 5 - 0.2
    evals = {r["step"]: r["eval"] for r in records(run, "eval")}
    assert evals[60]["accuracy"] > 0.55 and set(evals) == {10, 20, 30, 40, 50, 60}
    assert SCALARS <= _scalars(run)
    # rotation: the newest 2, plus the best by accuracy (ties: the later step)
    best = max((m["accuracy"], s) for s, m in evals.items())[1]
    kept = {s["step"] for _, s in checkpoint.complete_checkpoints(run / "checkpoints")}
    assert kept == {55, 60, best}
    assert checkpoint.resolve_checkpoint(run, "best").name == f"step-{best:07d}"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    info = json.loads((run / "run_info.json").read_text())
    assert "torch" in info["versions"] and "git_commit" in info and (run / "config.yaml").is_file()
    assert json.loads((run / "model_config" / "config.json").read_text())["id2label"]["2"] == "positive"

    from transformers import pipeline

    clf = pipeline("text-classification", model=str(run / "final"))
    out = clf(["w1 great w2 good", "w3 awful w4"])
    assert {o["label"] for o in out} <= set(LABELS) and all(0 <= o["score"] <= 1 for o in out)

    capsys.readouterr()
    assert train(cfg, str(config), resume="auto") == signals.EXIT_OK  # after the last step
    assert "nothing to do" in capsys.readouterr().out


def test_an_in_process_stop_and_resume_equals_the_uninterrupted_run(prepared, fresh_accelerate, monkeypatch, tmp_path):
    """The fast tier's member of test_resume_kill.py's property (there: real processes, SIGKILL, crashes in saves):
    a SIGTERM to this process after step 6 (the loop finishes step 7, mid-epoch and between checkpoints, saves it
    and returns 75), then a resume: per-step loss, lr, grad norm, eval metrics and final weights == the uninterrupted run's (dropout on,
    grad_accum 2, length-grouped batches); and so is the label audit (train.label_audit: its record through the
    checkpoint, the same label_audit.jsonl byte for byte)."""
    import os
    import signal

    from pipeline.training import loop
    from tests.accelkit import reset
    from tests.training.trainkit import final_weights, trajectory

    config = prepared(train={"epochs": 2, "grad_accum": 2, "save_every": 4, "eval_every": 5, "group_by_length": True,
                             "label_audit": True})
    ref = clone_prepared(config, tmp_path / "ref")
    assert train(load_config(ref), str(ref)) == signals.EXIT_OK
    real = loop._log_train

    def log_train(s, st, win):
        real(s, st, win)
        if st.step == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's own handler takes it: a flag

    monkeypatch.setattr(loop, "_log_train", log_train)
    reset()
    assert train(load_config(config), str(config)) == signals.EXIT_INTERRUPTED
    assert [s["step"] for _, s in checkpoint.complete_checkpoints(run_dir(config) / "checkpoints")][-1] == 7
    monkeypatch.setattr(loop, "_log_train", real)
    reset()
    assert train(load_config(config), str(config), resume="auto") == signals.EXIT_OK
    assert trajectory(run_dir(config)) == trajectory(run_dir(ref)) and len(trajectory(run_dir(ref))) == 24
    a, b = final_weights(run_dir(config)), final_weights(run_dir(ref))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = (run_dir(config) / "label_audit.jsonl").read_text()
    assert report == (run_dir(ref) / "label_audit.jsonl").read_text() and len(report.splitlines()) == 160


def test_trainings_last_validation_equals_evaluate_on_the_validation_split(prepared, fresh_accelerate):
    import dataclasses

    from pipeline.evaluation.run import evaluate_checkpoint

    config = prepared(train={"epochs": 1, "eval_every": 5, "save_every": 0})
    cfg = load_config(config)
    assert train(cfg, str(config)) == signals.EXIT_OK
    last = records(run_dir(config), "eval")[-1]["eval"]
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, split="validation", checkpoint="final"))
    scored = evaluate_checkpoint(cfg, str(config), progress=False)["chunk"]
    assert {k: scored[k] for k in last} == last  # same predict-and-score code, same batches: equal, not close


def test_a_log_record_covers_its_whole_window(prepared, fresh_accelerate, tmp_path):
    """log_every=5: each record holds the mean loss and the summed tokens of its 5 steps (the same
    run logged every step says what those are), not the last step's alone."""
    import yaml
    from accelerate.state import AcceleratorState, GradientState

    every = prepared(train={"epochs": 1, "log_every": 1, "save_every": 0})
    assert train(load_config(every), str(every)) == signals.EXIT_OK
    steps = records(run_dir(every))
    config = clone_prepared(every, tmp_path / "window")
    tree = yaml.safe_load(config.read_text())
    tree["train"].update(log_every=5, eval_every=5)  # evaluation inside the window is not throughput
    config.write_text(yaml.safe_dump(tree))
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    logged = records(run_dir(config))
    assert [r["step"] for r in logged] == [s["step"] for s in steps][4::5] and len(logged) >= 2
    for i, r in enumerate(logged):
        mine = steps[5 * i : 5 * i + 5]
        assert r["steps"] == 5 and r["tokens"] == sum(s["tokens"] for s in mine)
        assert r["loss"] == pytest.approx(sum(s["loss"] for s in mine) / 5, rel=1e-12)
        assert r["samples_per_s"] * r["seconds"] == pytest.approx(5 * 8)  # 5 steps of batch 8


@pytest.mark.parametrize("every", [3, 0])
def test_the_heaps_free_pages_go_back_every_release_memory_every_steps(prepared, fresh_accelerate, monkeypatch, every):
    """train.release_memory_every=3: malloc_trim after steps 3, 6, ... (varying batch shapes must not grow
    the resident size run after run: bench_memory.py); 0 turns it off."""
    from pipeline.training import memory

    at = []
    monkeypatch.setattr(memory, "release_free_heap", lambda: at.append(True) or True)
    config = prepared(train={"epochs": 1, "log_every": 1, "save_every": 0, "release_memory_every": every})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    steps = records(run_dir(config))[-1]["step"]
    assert steps >= 6 and len(at) == (steps // every if every else 0)


def test_gpt2_from_scratch_with_bpe(prepared, fresh_accelerate):
    config = prepared(kind="bpe", train={"epochs": 1, "save_every": 0})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    from transformers import pipeline

    final = run_dir(config) / "final"
    conf = json.loads((final / "config.json").read_text())
    assert conf["model_type"] == "gpt2" and conf["pad_token_id"] is not None
    assert pipeline("text-classification", model=str(final))("w1 great")[0]["label"] in LABELS


def _poison_classifier(monkeypatch, bad_calls: set[int] | None, from_call: int | None = None):
    """Make the classifier head output NaN on chosen training forward passes (test-side patch)."""
    task = tasks.get("classification")
    real = task.build_model
    calls = {"n": 0}

    def hook(mod, args, out):
        if not mod.training:
            return out
        calls["n"] += 1
        if (bad_calls and calls["n"] in bad_calls) or (from_call and calls["n"] >= from_call):
            return out * float("nan")
        return out

    def patched(*a, **k):
        model = real(*a, **k)
        model.classifier.register_forward_hook(hook)
        return model

    monkeypatch.setitem(tasks.TASKS, "classification", dataclasses.replace(task, build_model=patched))


def test_nan_skip_drops_the_update_and_continues(prepared, fresh_accelerate, monkeypatch):
    _poison_classifier(monkeypatch, bad_calls={3})
    config = prepared(train={"epochs": 1, "nan_policy": "skip", "save_every": 0})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    rows = records(run_dir(config), "all")
    events = [r for r in rows if r.get("event") == "nonfinite"]
    assert [e["step"] for e in events] == [3] and events[0]["skipped_total"] == 1
    assert [r["nonfinite_skipped"] for r in records(run_dir(config))][-1] == 1


def test_nan_skip_halts_after_k_in_a_row_and_the_replay_names_the_operation(prepared, fresh_accelerate, monkeypatch, capsys):
    _poison_classifier(monkeypatch, None, from_call=4)
    config = prepared(train={"epochs": 1, "nan_policy": "skip", "max_nan_in_a_row": 3, "save_every": 2, "keep_last": 1,
                             "keep_best": 0})
    assert train(load_config(config), str(config)) == signals.EXIT_NONFINITE
    err = capsys.readouterr().err
    healthy = run_dir(config) / "checkpoints" / "step-0000002"  # steps 4-6 skipped: 4 and 6 saved mid-streak
    assert "3 in a row" in err and f"last healthy checkpoint: {healthy}" in err
    assert healthy.is_dir()  # keep_last=1 rotated step-4 away, never the last healthy one
    replay = f"--resume {healthy} train.detect_anomaly=true"
    assert replay in err

    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    cfg = load_config(config, ["train.detect_anomaly=true"])  # the head still outputs NaN: the replay meets it at once
    assert train(cfg, str(config), resume=str(healthy)) == signals.EXIT_NONFINITE
    err = capsys.readouterr().err
    # the NaN logits enter cross-entropy first: its backward is the first to return NaN
    assert "warning: anomaly detection (train.detect_anomaly) at step 3: Function 'LogSoftmaxBackward0' returned nan" in err


def test_nan_halt_names_last_healthy_checkpoint(prepared, fresh_accelerate, monkeypatch, capsys):
    _poison_classifier(monkeypatch, bad_calls={5})
    config = prepared(train={"epochs": 1, "nan_policy": "halt", "save_every": 2})
    assert train(load_config(config), str(config)) == signals.EXIT_NONFINITE
    err = capsys.readouterr().err
    assert "nan_policy=halt" in err and "step-0000004" in err
    assert not (run_dir(config) / "final").exists()


def test_lr_schedule_values():
    f = build.lr_factor
    assert [f(s, total=10, warmup=2, min_ratio=0.1) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert f(6, total=10, warmup=2, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert f(10, total=10, warmup=2, min_ratio=0.1) == pytest.approx(0.1)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    t = load_config(None, ["train.lr=0.01", "train.warmup_ratio=0.2", "train.min_lr_ratio=0.1"]).train
    opt, sched = build.build_optimizer(model, t, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.005, 0.01, 0.01]) and lrs[-1] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + __import__("math").cos(__import__("math").pi * 7 / 8))))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == t.weight_decay and len(decay["params"]) == 1  # only the Linear weight
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3  # bias, LayerNorm weight and bias


def test_each_lr_schedule_gives_the_hand_computed_rates():
    """train.lr_schedule after a 2-step warmup of a 10-step run, min_lr_ratio 0.1: linear falls by 0.9/8 a step,
    constant stays at 1, wsd with decay_ratio 0.3 holds 1 to step 7 and falls by 0.3 a step to 0.1 at step 10."""
    f = build.lr_factor
    kw = {"total": 10, "warmup": 2, "min_ratio": 0.1}
    assert [f(s, **kw, kind="linear") for s in (0, 1, 2, 6, 10)] == pytest.approx([0.5, 1.0, 1.0, 0.55, 0.1])
    assert [f(s, **kw, kind="constant") for s in (0, 1, 2, 9, 10)] == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert [f(s, **kw, kind="wsd", decay=0.3) for s in range(11)] == pytest.approx(
        [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.4, 0.1])
    # a longer wsd run is the same run until its own decay starts
    assert [f(s, total=40, warmup=0, min_ratio=0.1, kind="wsd") for s in range(36)] == \
        [f(s, total=20, warmup=0, min_ratio=0.1, kind="wsd") for s in range(18)] + [1.0] * 18
    with pytest.raises(ConfigError, match=r"^train.lr_schedule: 'step' is not one of 'cosine', 'linear', 'constant', "
                                          r"'wsd'"):
        load_config(None, ["train.lr_schedule=step"])


@pytest.mark.slow  # two 40-step runs (~3 s); the rule itself: test_each_lr_schedule_gives_the_hand_computed_rates
def test_a_wsd_run_resumed_in_its_stable_phase_with_more_steps_equals_the_longer_run(prepared, fresh_accelerate,
                                                                                       tmp_path):
    """Warmup-stable-decay's promise: a 20-step run stopped in its stable phase (its step-8 checkpoint) and resumed
    with train.max_steps=40 trains as the run planned for 40 steps from the start: the same losses and rates at
    every step, the same final weights (no warmup: its length is a share of the planned steps)."""
    import shutil

    from tests.accelkit import reset
    from tests.training.trainkit import final_weights, trajectory

    wsd = {"lr_schedule": "wsd", "warmup_ratio": 0.0, "save_every": 8, "epochs": 10, "keep_last": 5}
    short = prepared(train={**wsd, "max_steps": 20})
    long = clone_prepared(short, tmp_path / "long")
    assert train(load_config(short), str(short)) == signals.EXIT_OK
    run = run_dir(short)
    for later in ("step-0000016", "step-0000020"):
        shutil.rmtree(run / "checkpoints" / later)
    shutil.rmtree(run / "final")
    reset()
    assert train(load_config(short, ["train.max_steps=40"]), str(short), "auto") == signals.EXIT_OK
    reset()
    assert train(load_config(long, ["train.max_steps=40"]), str(long)) == signals.EXIT_OK
    assert trajectory(run) == trajectory(run_dir(long))
    a, b = final_weights(run), final_weights(run_dir(long))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["adafactor", "sgd", "lion"])
def test_each_optimizer_trains_and_an_in_process_resume_equals_the_run_that_never_stopped(name, prepared,
                                                                                          fresh_accelerate):
    """train.optimizer: its state goes through save_state/load_state, so a run resumed from its step-4 checkpoint
    ends with the weights of the run that never stopped (torch.equal), and its card names it. The same under
    SIGKILL, in real processes: test_resume_kill.py's test_each_optimizer_killed_and_resumed_equals_the_
    uninterrupted_run."""
    import shutil

    from tests.accelkit import reset
    from tests.training.trainkit import clone_prepared, final_weights, trajectory

    lr = {"adafactor": 1e-2, "sgd": 5e-2, "lion": 1e-4}[name]
    a = prepared(train={"optimizer": name, "lr": lr, "max_steps": 8, "save_every": 4, "eval_every": 4})
    b = clone_prepared(a, a.parent / "b")
    assert train(load_config(a), str(a)) == signals.EXIT_OK
    reset()
    assert train(load_config(b), str(b)) == signals.EXIT_OK
    shutil.rmtree(run_dir(b) / "checkpoints" / "step-0000008")
    shutil.rmtree(run_dir(b) / "final")
    reset()
    assert train(load_config(b), str(b), "auto") == signals.EXIT_OK
    assert trajectory(run_dir(a)) == trajectory(run_dir(b))
    x, y = final_weights(run_dir(a)), final_weights(run_dir(b))
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    losses = [r["loss"] for r in records(run_dir(a)) if "loss" in r]
    assert losses[-1] < losses[0]  # it trains
    card = (run_dir(a) / "final" / "README.md").read_text(encoding="utf-8")
    assert f"| optimizer | {dict(adafactor='Adafactor', sgd='SGD (momentum 0.9)', lion='Lion')[name]}, lr {lr:g}," in card


def test_an_optimizer_that_is_not_one_lists_the_choices_and_lion_without_its_package_names_the_extra(monkeypatch):
    import importlib.util

    with pytest.raises(ConfigError, match=r"^train.optimizer: 'adam' is not one of 'adamw', 'adafactor', 'sgd', 'lion'"):
        load_config(None, ["train.optimizer=adam"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lion_pytorch" else real(n, *a))
    with pytest.raises(ValueError, match=r"^train.optimizer=lion needs lion-pytorch: pip install -c constraints.txt "
                                         r"-e '.\[lion\]' \(or choose adamw, adafactor or sgd\)$"):
        build.check_optimizer(load_config(None, ["train.optimizer=lion"]).train)


def _stop_by_hand(evals: list[tuple[int, float]], patience: int, delta: float) -> int | None:
    """The patience rule computed from the validation records alone: the step of the patience-th validation in a
    row that did not beat the last counted value by more than delta (accuracy: higher is better)."""
    value, stale = None, 0
    for step, v in evals:
        if value is None or v - value > delta:
            value, stale = v, 0
        else:
            stale += 1
            if stale >= patience:
                return step
    return None


def test_early_stopping_stops_where_the_rule_says_and_ends_with_the_best_checkpoints_model(prepared,
                                                                                         fresh_accelerate):
    """patience 2 and a delta no validation accuracy can beat (1.0): the run stops at its third validation, having
    saved each new best; final/ holds the best validation's weights (the checkpoint's, torch.equal), final/
    state.json, metrics.jsonl, the console and the card say why. A run killed after the stop's checkpoint and
    before the export (final/ gone), and one resumed from a checkpoint before the stop, end the same."""
    import shutil

    from safetensors.torch import load_file

    from pipeline.training import state_io
    from tests.accelkit import reset
    from tests.training.trainkit import final_weights

    es = {"early_stopping_patience": 2, "early_stopping_delta": 1.0, "eval_every": 2, "save_every": 0,
          "max_steps": 40, "keep_last": 5}
    config = prepared(train=es)
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    run = run_dir(config)
    metric = load_config(config).train.metric_for_best
    evals = [(r["step"], r["eval"][metric]) for r in records(run, "eval")]
    stop = _stop_by_hand(evals, 2, 1.0)
    assert stop == 6 and evals[-1][0] == 6 and records(run)[-1]["step"] == 6
    best_step = max(evals, key=lambda e: (e[1], -e[0]))[0]  # the first step reaching the best value
    state = json.loads((run / "final" / "state.json").read_text())
    assert state["step"] == best_step and state["early_stopped"]["stopped_at"] == 6
    assert state["early_stopped"]["best_step"] == best_step
    best_ckpt = load_file(str(run / "checkpoints" / f"step-{best_step:07d}" / "model.safetensors"))
    final = final_weights(run)
    assert all(torch.equal(final[k], best_ckpt[k]) for k in best_ckpt)
    event = [r for r in records(run, "all") if r.get("event") == "early_stopped"]
    assert event and event[0]["stopped_at"] == 6 and event[0]["best_step"] == best_step
    assert state_io.TrainState.read(run / "checkpoints" / "step-0000006" / "state.json").patience.stale == 2
    card = (run / "final" / "README.md").read_text(encoding="utf-8")
    assert f"| early stopping | patience 2 validations, delta 1: stopped at step 6; this is step {best_step}'s model |" \
        in card

    shutil.rmtree(run / "final")  # killed after the stop's checkpoint, before the export
    reset()
    assert train(load_config(config), str(config), "auto") == signals.EXIT_OK
    again = final_weights(run)
    assert all(torch.equal(again[k], final[k]) for k in final)
    for later in ("step-0000006",):  # resumed from before the stop: trains to it again
        shutil.rmtree(run / "checkpoints" / later, ignore_errors=True)
    shutil.rmtree(run / "final")
    reset()
    assert train(load_config(config), str(config), "auto") == signals.EXIT_OK
    again = final_weights(run)
    assert all(torch.equal(again[k], final[k]) for k in final)
    assert json.loads((run / "final" / "state.json").read_text())["early_stopped"]["stopped_at"] == 6


def test_early_stopping_needs_validations_and_a_kept_best_checkpoint():
    with pytest.raises(ConfigError, match=r"^train.early_stopping_patience=3 counts validations, and train.eval_every=0"):
        load_config(None, ["train.early_stopping_patience=3", "train.eval_every=0"])
    with pytest.raises(ConfigError, match=r"^train.early_stopping_patience ends the run with the best checkpoint's "
                                          r"model, and train.keep_best=0 keeps none"):
        load_config(None, ["train.early_stopping_patience=3", "train.keep_best=0"])


def test_class_weights_and_label_smoothing_give_the_hand_computed_loss():
    """Two rows, three classes: cross-entropy with weights w and smoothing e is, per row, w_y (1 - e) (-log p_y)
    + (e / C) sum_c w_c (-log p_c), over the sum of the rows' w_y (torch's definition); multilabel's targets go to
    e/2 and 1 - e/2, each label's term weighted, the mean over rows and labels."""
    import math

    from pipeline import tasks as registry

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    labels = torch.tensor([0, 2])
    w, e = [1.0, 2.0, 3.0], 0.1
    logp = [[x - math.log(sum(math.exp(v) for v in row)) for x in row] for row in logits.tolist()]
    rows = [w[y] * (1 - e) * -logp[i][y] + e / 3 * sum(w[c] * -logp[i][c] for c in range(3))
            for i, y in enumerate(labels.tolist())]
    want = sum(rows) / sum(w[y] for y in labels.tolist())
    got = registry.get("classification").weighted_loss(logits, labels, torch.tensor(w), e)
    assert got.item() == pytest.approx(want, rel=1e-6)
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])

    def bce(x, t):
        return -(t * math.log(1 / (1 + math.exp(-x))) + (1 - t) * math.log(1 - 1 / (1 + math.exp(-x))))

    terms = [w[c] * bce(logits[i][c].item(), targets[i][c].item() * (1 - e) + e / 2) for i in range(2) for c in range(3)]
    got = registry.get("multilabel").weighted_loss(logits, targets, torch.tensor(w), e)
    assert got.item() == pytest.approx(sum(terms) / 6, rel=1e-6)


def test_class_weights_are_balanced_from_the_train_rows_or_named_and_refused_in_one_line():
    from datasets import Dataset

    from pipeline import tasks as registry
    from pipeline.training.setup import class_weights

    task, info = registry.get("classification"), {"label_names": ["neg", "neu", "pos"]}
    train = Dataset.from_dict({"label": [0, 0, 0, 1, 2, 2]})

    def weights(*items):
        return class_weights(load_config(None, [f"train.class_weights=[{', '.join(items)}]"]).train, task, train, info)

    assert weights("balanced").tolist() == pytest.approx([6 / 9, 6 / 3, 6 / 6])  # n / (classes x count)
    assert weights("pos:2.5").tolist() == [1.0, 1.0, 2.5]
    with pytest.raises(ValueError, match=r"^train.class_weights: 'positive' is not a class of the prepared data; "
                                         r"classes: neg, neu, pos$"):
        weights("positive:2")
    with pytest.raises(ValueError, match=r"^train.class_weights: 'pos' is not name:weight with a weight >= 0"):
        weights("pos")
    empty = Dataset.from_dict({"label": [0, 0, 2]})
    with pytest.raises(ValueError, match=r"^train.class_weights=balanced: class 'neu' has no train rows"):
        class_weights(load_config(None, ["train.class_weights=balanced"]).train, task, empty, info)
    from tests.training.trainkit import REPO

    with pytest.raises(ConfigError, match=r"^train.label_smoothing: task=regression has no targets to smooth; it "
                                          r"applies to classification, causal_lm, instruct, multilabel$"):
        load_config(REPO / "configs" / "regression.yaml", ["train.label_smoothing=0.1"])
    with pytest.raises(ConfigError, match=r"^train.class_weights: task=causal_lm has no classes to weigh; it applies "
                                          r"to classification, multilabel$"):
        load_config(REPO / "configs" / "shakespeare.yaml", ["train.class_weights=balanced"])
    load_config(REPO / "configs" / "shakespeare.yaml", ["train.label_smoothing=0.1"])  # a language model's tokens


@pytest.mark.slow  # three 8-step runs; the arithmetic and the refusals: the two tests above
def test_a_weighted_smoothed_run_trains_its_own_loss_and_resumes_exactly(prepared, fresh_accelerate):
    """class_weights=balanced and label_smoothing 0.1: the first step's loss is not the plain run's, the card
    says the loss, and a resume from the step-4 checkpoint ends with the uninterrupted run's weights."""
    import shutil

    from tests.accelkit import reset
    from tests.training.trainkit import final_weights, trajectory

    plain = prepared(train={"max_steps": 8, "save_every": 4})
    a = clone_prepared(plain, plain.parent / "a")
    b = clone_prepared(plain, plain.parent / "b")
    extra = ["train.class_weights=balanced", "train.label_smoothing=0.1"]
    assert train(load_config(plain), str(plain)) == signals.EXIT_OK
    for config in (a, b):
        reset()
        assert train(load_config(config, extra), str(config)) == signals.EXIT_OK
    assert records(run_dir(a))[0]["loss"] != records(run_dir(plain))[0]["loss"]
    card = (run_dir(a) / "final" / "README.md").read_text(encoding="utf-8")
    assert "| loss | label smoothing 0.1; class weights balanced |" in card
    shutil.rmtree(run_dir(b) / "checkpoints" / "step-0000008")
    shutil.rmtree(run_dir(b) / "final")
    reset()
    assert train(load_config(b, extra), str(b), "auto") == signals.EXIT_OK
    assert trajectory(run_dir(a)) == trajectory(run_dir(b))
    x, y = final_weights(run_dir(a)), final_weights(run_dir(b))
    assert all(torch.equal(x[k], y[k]) for k in x)


def test_a_language_models_smoothed_loss_is_its_own_loss_at_zero_and_the_hand_computed_one_above():
    """causal_lm's train.label_smoothing: the next-token cross-entropy over the targets the model's own loss
    averages (labels shifted, IGNORE left out), each target's -log p mixed with e x the mean -log p over the
    vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline import tasks as registry
    from pipeline.tasks.causal_lm.collate import IGNORE

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, 50, (2, 10))
    labels = ids.masked_fill(torch.rand(2, 10) < 0.3, IGNORE)
    loss = registry.get("causal_lm").weighted_loss
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
        assert loss(out.logits, labels, None, 0.0).item() == pytest.approx(out.loss.item(), rel=1e-6)
        logp = torch.log_softmax(out.logits[:, :-1].double(), -1)
        kept = labels[:, 1:] != IGNORE
        nll = -logp.gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0][kept]
        uniform = -logp.mean(-1)[kept]
        want = ((1 - 0.1) * nll + 0.1 * uniform).mean().item()
        assert loss(out.logits, labels, None, 0.1).item() == pytest.approx(want, rel=1e-5)
