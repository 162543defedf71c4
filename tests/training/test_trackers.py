"""train.report_to: every tracker, read back through its own client, holds what metrics.jsonl holds: the scalars
(per-rank losses of a 2-process run included) at their steps, the resolved config as parameters, the best metric,
and evaluate.py's figures; a run stopped by SIGTERM and resumed continues the same tracker runs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest

import tests.trackerkit as tk
from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.training import trackers
from tests.training.multikit import launch_two_processes, log_of, stop, wait_all, wait_for_step, workers
from tests.training.trainkit import REPO, _env, build_prepared, launch, run_dir, run_train

ALL = ["tensorboard", "mlflow", "wandb", "aim"]
READERS = {"mlflow": tk.mlflow_scalars, "wandb": tk.wandb_scalars, "aim": tk.aim_scalars}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """Two processes reporting to all four trackers, SIGTERM to rank 1 after step 4, resumed, then evaluated."""
    root = tmp_path_factory.mktemp("tracked")
    cfg = build_prepared(root, train={"report_to": ALL, "max_steps": 12, "log_every": 2, "eval_every": 4,
                                      "save_every": 2, "experiment": "trackers-test"})
    run = run_dir(cfg)
    first = launch_two_processes(cfg, log="first")
    try:
        rank1 = workers(first, 2)[1]
        wait_for_step([first], run, 4)
        os.kill(rank1, signal.SIGTERM)
        wait_all([first], timeout=120)
    finally:
        stop(first)
    ids = json.loads((run / trackers.IDS).read_text())
    resumed = wait_all([launch_two_processes(cfg, "--resume", "auto", log="resumed")], timeout=300)[0]
    assert resumed == 0, log_of(cfg, "resumed")[-3000:]
    ev = subprocess.run([sys.executable, str(REPO / "pipeline" / "evaluate.py"), "--config", str(cfg), "--split", "test"],
                        capture_output=True, text=True, timeout=180, env=_env(), cwd=REPO)
    assert ev.returncode == 0, ev.stderr[-3000:]
    return {"cfg": cfg, "run": run, "ids_at_stop": ids, "log": log_of(cfg, "first") + log_of(cfg, "resumed")}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(READERS))
def test_each_tracker_holds_the_runs_scalars_config_and_test_metrics(tracked, name):
    run, cfg = tracked["run"], load_config(tracked["cfg"])
    ids = json.loads((run / trackers.IDS).read_text())
    assert ids == tracked["ids_at_stop"], "the resume opened new tracker runs instead of continuing the first"
    scalars, params, runs = READERS[name](run, ids[name])
    expected = tk.expected_scalars(run)
    assert {"train/loss_rank_0", "train/loss_rank_1", "eval/accuracy", "train/lr"} <= set(expected)
    assert max(expected["train/loss"]) == 12 and len(expected["train/loss"]) == 6
    for key, by_step in expected.items():  # the last value per step: a resume logs its redone steps again, equal
        assert scalars[key] == by_step, f"{name}: {key}"
    best = json.loads((run / "final" / "trainer_state.json").read_text())["best"] \
        if (run / "final" / "trainer_state.json").is_file() else None
    finished = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"finished"' in line]
    best = finished[-1]["best"] if best is None else best
    assert scalars[f"best/{best['metric']}"] == {12: best["value"]} and scalars["best/step"] == {12: best["step"]}
    test = json.loads((run / "eval" / "test-final" / "metrics.json").read_text())
    assert scalars["test/chunk/accuracy"] == {12: test["chunk"]["accuracy"]}
    assert scalars["test/document/per_class/negative/f1"] == {12: test["document"]["per_class"]["negative"]["f1"]}
    flat = trackers.params(cfg)  # the resolved config, every key, as the first launch had it
    assert flat["train.lr"] == 3e-3 and flat["train.report_to"] == json.dumps(ALL)
    if name == "mlflow":  # MLflow keeps parameters as text
        assert params == {k: str(v) for k, v in flat.items()} and runs == 1
    else:
        assert params == flat
        # aim: one run; wandb offline: one folder per launch of the same run id (train, resume, evaluate)
        assert runs == (1 if name == "aim" else 3)


@pytest.mark.slow
def test_tensorboard_receives_the_same_scalars(tracked):
    run = tracked["run"]
    got, expected = tk.tensorboard_scalars(run), tk.expected_scalars(run)
    for key, by_step in expected.items():  # event files hold float32
        assert got[key].keys() == by_step.keys(), key
        assert all(math.isclose(got[key][s], v, rel_tol=1e-6, abs_tol=1e-30) for s, v in by_step.items()), key


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_into_the_same_tracker_runs(tmp_path):
    """SIGKILL leaves no chance to close a tracker: MLflow's run stays RUNNING, Aim's lock stays on disk, W&B's
    log may end mid-record. The resume continues each tracker run; MLflow, Aim and TensorBoard (flushed at each
    checkpoint) hold every step, and W&B's values are the run's, less what it had not written when killed."""
    cfg = build_prepared(tmp_path, train={"report_to": ALL, "max_steps": 10, "log_every": 1,
                                          "eval_every": 5, "save_every": 2})
    run = run_dir(cfg)
    proc = launch(cfg)
    try:
        wait_for_step([proc], run, 5)
    finally:
        proc.kill()
        proc.wait()
    ids = json.loads((run / trackers.IDS).read_text())
    resumed = run_train(cfg, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / trackers.IDS).read_text()) == ids
    expected = tk.expected_scalars(run)
    assert max(expected["train/loss"]) == 10
    resumed_at = int(json.loads((run / "run_info.json").read_text())["launches"][1]["resumed_from"][-7:])
    for name, read in READERS.items():
        scalars, _, runs = read(run, ids[name])
        assert runs == (2 if name == "wandb" else 1), name
        for key, by_step in expected.items():
            if name == "wandb":  # written every second: a kill loses up to a second of it, never a resumed step
                assert scalars[key].items() <= by_step.items(), f"{name}: {key}"
                assert {s for s in by_step if s > resumed_at} <= scalars[key].keys(), f"{name}: {key}"
            else:
                assert scalars[key] == by_step, f"{name}: {key}"
    tb = tk.tensorboard_scalars(run)
    assert all(tb[key].keys() == by_step.keys() for key, by_step in expected.items())


@pytest.mark.slow
def test_evaluate_reports_into_the_trackers_the_run_used_whatever_its_command_line(tmp_path):
    cfg = build_prepared(tmp_path, train={"max_steps": 4, "eval_every": 2, "save_every": 2})
    assert run_train(cfg, "train.report_to=tensorboard,mlflow").returncode == 0  # mlflow on train's command line only
    ev = subprocess.run([sys.executable, str(REPO / "pipeline" / "evaluate.py"), "--config", str(cfg), "--split", "test"],
                        capture_output=True, text=True, timeout=180, env=_env(), cwd=REPO)
    assert ev.returncode == 0, ev.stderr[-3000:]
    run = run_dir(cfg)
    scalars, _, runs = tk.mlflow_scalars(run, json.loads((run / trackers.IDS).read_text())["mlflow"])
    test = json.loads((run / "eval" / "test-final" / "metrics.json").read_text())
    assert runs == 1 and scalars["test/document/accuracy"] == {4: test["document"]["accuracy"]}


def test_report_to_parses_commas_and_refuses_unknown_and_repeated_trackers(tmp_path):
    cfg = build_prepared(tmp_path)
    assert load_config(cfg, ["train.report_to=tensorboard, mlflow"]).train.report_to == ["tensorboard", "mlflow"]
    assert load_config(cfg, ["train.report_to=[]"]).train.report_to == []
    with pytest.raises(ConfigError, match=r"^train.report_to: 'comet' is not one of 'tensorboard', 'mlflow'"):
        load_config(cfg, ["train.report_to=tensorboard,comet"])
    with pytest.raises(ConfigError, match=r"^train.report_to: 'aim' is given twice; name it once$"):
        load_config(cfg, ["train.report_to=aim,aim"])


def test_a_tracker_that_is_not_installed_is_one_line_naming_its_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    trackers.check_installed(["tensorboard", "mlflow"])
    with pytest.raises(ValueError, match=r"^train.report_to: wandb is not installed; pip install -c constraints.txt "
                                         r"-e '.\[wandb\]' \(or drop wandb from train.report_to\)$"):
        trackers.check_installed(["tensorboard", "wandb"])


def test_train_refuses_a_missing_tracker_before_any_work(tmp_path):
    """The check runs in train.py's process, before the run folder is touched."""
    cfg = build_prepared(tmp_path)
    code = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'aim' else real(n, *a); "
            "from pipeline.train import main; "
            f"sys.exit(main(['--config', {str(cfg)!r}, 'train.report_to=tensorboard,aim']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert p.returncode != 0 and "train.report_to: aim is not installed" in p.stderr.strip().splitlines()[-1]
    assert not run_dir(cfg).exists()


def test_a_tracker_that_cannot_start_is_one_line_and_leaves_no_lock(tmp_path, monkeypatch):
    """An MLflow server that does not answer (here: a tracking URI of a scheme MLflow does not know) is one line;
    Aim, started before it, holds no lock on its run afterwards (a resume could not open it otherwise)."""
    cfg = load_config(build_prepared(tmp_path), ["train.report_to=aim,mlflow"])
    cfg.run_dir.mkdir(parents=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuch://server")
    with pytest.raises(ValueError, match=r"^train.report_to: mlflow could not start: \w+: .*\(drop it from "):
        trackers.open_trackers(cfg, cfg.run_dir, fresh=True)
    assert (cfg.run_dir / ".aim" / "locks").is_dir() and list((cfg.run_dir / ".aim" / "locks").iterdir()) == []
