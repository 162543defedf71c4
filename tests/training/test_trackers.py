"""train.report_to: every tracker, read back through its own client, holds what metrics.jsonl holds: the scalars
at their steps and the resolved config as parameters; a run killed with SIGKILL and resumed continues the same
tracker runs; the config's checks. The 2-process run (per-rank losses, a SIGTERM to one rank and a resume into the
same tracker runs, the best metric, evaluate.py's figures reported into the run's trackers whatever evaluate's
command line) shares test_multiprocess.py's SIGTERM-and-resume run: its tests are there."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import pytest

import tests.trackerkit as tk
from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.training import trackers
from tests.training.multikit import train_here, wait_for_step
from tests.training.trainkit import build_prepared, clone_prepared, fork_launch, log_text, run_dir

ALL = ["tensorboard", "mlflow", "wandb", "aim"]
FAST = ["tensorboard", "aim"]  # the fast tier's run: the two that start in a moment (MLflow's new store and W&B's
# service take seconds; the slow tier's runs report to all four)
READERS = {"mlflow": tk.mlflow_scalars, "wandb": tk.wandb_scalars, "aim": tk.aim_scalars}


def test_an_in_process_run_reports_its_scalars_config_and_ids_to_its_trackers(tmp_path):
    """The fast tier's run through trackers (in this process, two steps, TensorBoard and Aim): each, read back through
    its own client, holds metrics.jsonl's scalars at their steps and the resolved config; trackers.json names the
    run. All four trackers: test_a_run_killed_with_sigkill_resumes_into_the_same_tracker_runs here, and the 2-process
    run of test_multiprocess.py (test_each_tracker_holds_the_runs_scalars_config_and_test_metrics)."""
    cfg = build_prepared(tmp_path, n_train=32, n_val=8, train={"max_steps": 2, "log_every": 1, "eval_every": 2,
                                                               "save_every": 0})
    report = f"train.report_to={','.join(FAST)}"
    with tk.in_process():
        assert train_here(cfg, report) == 0, log_text(cfg)[-3000:]
    run = run_dir(cfg)
    ids, expected = json.loads((run / trackers.IDS).read_text()), tk.expected_scalars(run)
    assert list(ids) == ["aim"]
    assert expected["train/loss"].keys() == {1, 2} and expected["eval/accuracy"].keys() == {2}
    scalars, params, runs = tk.aim_scalars(run, ids["aim"])
    assert all(scalars[key] == by_step for key, by_step in expected.items())
    assert runs == 1 and params == trackers.params(load_config(cfg, [report]))
    events = tk.tensorboard_scalars(run)  # event files hold float32
    for key, by_step in expected.items():
        assert events[key].keys() == by_step.keys(), key
        assert all(math.isclose(events[key][s], v, rel_tol=1e-6, abs_tol=1e-30) for s, v in by_step.items()), key


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_into_the_same_tracker_runs(tmp_path):
    """SIGKILL leaves no chance to close a tracker: MLflow's run stays RUNNING, Aim's lock stays on disk, W&B's
    log may end mid-record. The resume continues each tracker run; MLflow, Aim and TensorBoard (flushed at each
    checkpoint) hold every step, and W&B's values are the run's, less what it had not written when killed."""
    cfg = build_prepared(tmp_path, train={"report_to": ALL, "max_steps": 10, "log_every": 1,
                                          "eval_every": 5, "save_every": 2})
    run = run_dir(cfg)
    proc = fork_launch(cfg)  # a real process to kill, forked from the warm zygote (trainkit: no imports)
    try:
        wait_for_step([proc], run, 5)
    finally:
        proc.kill()
        proc.wait()
    ids = json.loads((run / trackers.IDS).read_text())
    with tk.in_process():  # the resume in this process: only the kill needs a process of its own
        assert train_here(cfg, resume="auto", log="resumed") == 0, log_text(cfg, "resumed")[-3000:]
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


def test_train_refuses_a_missing_tracker_before_any_work(tmp_path, monkeypatch, capsys):
    """The check runs in train.py's main (here under run_main, as its process runs it), before the run folder is
    touched."""
    import importlib.util

    from pipeline.cli import run_main
    from pipeline.train import main

    cfg = build_prepared(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "aim" else real(n, *a))
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run_main(lambda _: main(["--config", str(cfg), "train.report_to=tensorboard,aim"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and "train.report_to: aim is not installed" in err[-1]
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


@pytest.mark.slow
def test_only_this_runs_models_report_into_its_trackers_and_a_run_leaves_no_tracker_setting_behind(tmp_path):
    """Evaluating another run's checkpoint (`--checkpoint <other run>/run/final`) put its scores into this run's
    MLflow history at the other model's step (`test/document/accuracy` [(30, 0.443), (10, 0.373)]); and a run that
    reported to MLflow left MLFLOW_TRACKING_URI set in os.environ, so the next run in the same process (evaluate
    after train, a sweep's trials) and every process it started reported into the first run's database."""
    from pipeline.evaluate import main as evaluate_main
    from tests.accelkit import reset

    def evaluate(*args: str) -> int:
        reset()
        try:
            return evaluate_main(["--config", str(a), "--quiet", "--split", "test", *args])
        finally:
            reset()

    (tmp_path / "a").mkdir()
    a = build_prepared(tmp_path / "a", n_train=32, n_val=8, train={"max_steps": 2, "save_every": 0,
                                                                   "report_to": ["tensorboard", "mlflow"]})
    before = os.environ.get("MLFLOW_TRACKING_URI")
    assert train_here(a) == 0, log_text(a)[-3000:]
    assert os.environ.get("MLFLOW_TRACKING_URI") == before  # nothing of run a's store left for what runs next
    assert evaluate() == 0
    run = run_dir(a)
    mlflow_id = json.loads((run / trackers.IDS).read_text())["mlflow"]
    scalars, _, runs = tk.mlflow_scalars(run, mlflow_id)
    tested = {k: v for k, v in scalars.items() if k.startswith("test/")}
    assert runs == 1 and tested and all(by_step.keys() == {2} for by_step in tested.values()), tested
    b = clone_prepared(a, tmp_path / "b")  # the same data, another run, 3 steps
    assert train_here(b, "train.max_steps=3", "train.report_to=[]") == 0, log_text(b)[-3000:]
    assert evaluate("--checkpoint", str(run_dir(b) / "final")) == 0
    (other,) = [p for p in (run / "eval").iterdir() if p.name.startswith("test-other-final-")]
    assert json.loads((other / "metrics.json").read_text())["step"] == 3  # scored, in a folder of its own
    scalars, _, runs = tk.mlflow_scalars(run, mlflow_id)
    assert runs == 1 and {k: v for k, v in scalars.items() if k.startswith("test/")} == tested  # and nothing else
    assert os.environ.get("MLFLOW_TRACKING_URI") == before


def test_a_tracker_store_of_the_wrong_kind_is_one_line_naming_it_before_the_tracker_starts(tmp_path):
    """run/.aim as a file was "train.report_to: aim could not start: RuntimeError: " with no reason."""
    cfg = load_config(build_prepared(tmp_path), ["train.report_to=tensorboard,aim,mlflow"])
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / ".aim").write_text("not a repository")
    with pytest.raises(ValueError) as e:
        trackers.open_trackers(cfg, cfg.run_dir, fresh=True)
    assert str(e.value) == (f"train.report_to: aim keeps its runs in {cfg.run_dir / '.aim'}, which is a file, not a "
                            f"folder; move it away (or drop aim from train.report_to)")
    (cfg.run_dir / ".aim").unlink()
    (cfg.run_dir / "mlflow.db").mkdir()
    with pytest.raises(ValueError, match=r"^train.report_to: mlflow keeps its runs in .*mlflow.db, which is a "
                                         r"folder, "):
        trackers.open_trackers(replace(cfg, train=replace(cfg.train, report_to=["mlflow"])), cfg.run_dir, fresh=True)


def test_an_exception_without_a_message_is_named_by_what_is_behind_it():
    try:
        try:
            raise OSError(30, "Read-only file system")
        except OSError:
            raise RuntimeError from None
    except RuntimeError as e:
        assert trackers._reason(e) == "RuntimeError (no message)"
    try:
        try:
            raise OSError(30, "Read-only file system")
        except OSError:
            raise RuntimeError  # noqa: B904 - the context is what the test reads
    except RuntimeError as e:
        assert trackers._reason(e) == "RuntimeError (OSError: [Errno 30] Read-only file system)"
