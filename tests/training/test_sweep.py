"""pipeline/sweep.py: trials are normal run folders, pruned from their validation metric, and a sweep SIGKILLed
twice (once inside a trial, once between trials) ends with the same trials and best value as one never stopped.

Each trial is a train.py process, as a sweep runs it; a sweep that is killed (or shares a study with another) is a
process of its own, forked from the warm zygote (`_start`). The sweeps that run to their end untouched (the
uninterrupted reference, the killed sweep's last rerun, one of two sharing a study) run sweep.py's main in this
process (`_sweep_here`). Three trials show what four did (pruning after the first; a kill inside trial 0, another
after trial 1, the rerun finishing trial 2).
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from pipeline.config import ConfigError
from tests.training.trainkit import REPO, build_prepared, clone_prepared, records
from tests.zygote import child_env, zygote

SPACE = """name: s
trials: 3
seed: 3
startup_trials: 2
pruner_startup_trials: 1
params:
  train.lr: {low: 1.0e-4, high: 1.0e-1, log: true}
  train.warmup_ratio: {low: 0.0, high: 0.3}
  train.batch_size: {choices: [4, 8]}
"""


def _start(cfg: Path, space: Path, log: Path):
    """`python pipeline/sweep.py --space SPACE --config CFG` as a real process, forked from the warm zygote
    (trainkit.zygote: no imports), its output to `log`; it starts its trials as train.py processes."""
    argv = [REPO / "pipeline" / "sweep.py", "--space", space, "--config", cfg]
    return zygote().start([str(a) for a in argv], log, log, child_env())


def _forked_trial(cmd: list, stdout, stderr, env: dict, cwd: str, preexec_fn):
    """subprocess.Popen for study._run_trial: the trial's `python pipeline/train.py ...` forked from the warm zygote
    (a real process that skips the imports; poll, send_signal and returncode as Popen's), its output to the trial's
    train.log. Only for sweeps that run in this process and are never killed: the trial dying with its sweep
    (preexec_fn, PR_SET_PDEATHSIG) is the killed sweeps' part, whose trials are started as the product starts them."""
    assert Path(cmd[1]).name == "train.py"  # (the zygote's children run in the repository root; the paths are absolute)
    return zygote().start(cmd[1:], Path(stdout.name), Path(stdout.name), env)


def _sweep_here(cfg: Path, space: Path) -> tuple[int, str]:
    """`python pipeline/sweep.py --space SPACE --config CFG`, its main in this process (its trials are train.py
    processes all the same, forked: _forked_trial; the environment variables main sets for its process are undone
    after): its exit code and what it printed."""
    from pipeline.sweep import main
    from pipeline.sweeps import study

    out = io.StringIO()
    with redirect_stdout(out), mock.patch.dict(os.environ), \
            mock.patch.object(study, "subprocess", SimpleNamespace(Popen=_forked_trial, STDOUT=subprocess.STDOUT)):
        code = main(["--space", str(space), "--config", str(cfg)])
    return code, out.getvalue()


def _trials(folder: Path) -> list[tuple]:
    """(number, state, params, value, reported validation values) of every trial, from Optuna's storage."""
    import optuna

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 'study.db'}")
    return [(t.number, t.state.name, t.params, t.value, t.intermediate_values) for t in study.get_trials()]


def _wait(predicate, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before the moment to kill it"
        assert time.monotonic() < deadline, "timed out waiting for the moment to kill the sweep"
        time.sleep(0.05)


def _finished_rows(folder: Path) -> int:
    path = folder / "trials.csv"
    if not path.is_file():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(row["state"] != "running" for row in csv.DictReader(f))


def _trainers_of(folder: Path) -> list:
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(folder) in part for part in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    base = build_prepared(tmp_path_factory.mktemp("sweep"), train={"max_steps": 8, "eval_every": 2, "log_every": 1,
                                                                   "save_every": 2})
    space = base.parent / "space.yaml"
    space.write_text(SPACE, encoding="utf-8")
    code, stdout = _sweep_here(base, space)
    assert code == 0, stdout[-3000:]
    cut = clone_prepared(base, tmp_path_factory.mktemp("killed"))
    folder = cut.parent / "out" / "sweeps" / "s"
    proc = _start(cut, space, cut.parent / "first.log")
    _wait(lambda: any(r["step"] >= 3 for r in records(folder / "trial-0000")), proc)  # inside trial 0
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    orphans = _trainers_of(folder)  # the trial's train.py dies with the sweep (PR_SET_PDEATHSIG)
    proc = _start(cut, space, cut.parent / "second.log")
    _wait(lambda: _finished_rows(folder) >= 2, proc)  # trial 1 told, trial 2 not yet (or just) started
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last, printed = _sweep_here(cut, space)
    assert last == 0, printed[-3000:]
    return {"whole": base.parent / "out" / "sweeps" / "s", "cut": folder, "orphans": orphans, "stdout": stdout}


@pytest.mark.slow
def test_a_sweep_killed_twice_ends_as_one_never_stopped(sweeps):
    whole, cut = _trials(sweeps["whole"]), _trials(sweeps["cut"])
    assert len(whole) == 3 and {t[1] for t in whole} == {"COMPLETE", "PRUNED"}  # pruning happened, from validation
    assert cut == whole  # the same parameters, states, values and reported validations, trial by trial
    assert sweeps["orphans"] == []
    s_whole = json.loads((sweeps["whole"] / "summary.json").read_text())
    s_cut = json.loads((sweeps["cut"] / "summary.json").read_text())
    assert s_cut["best"]["value"] == s_whole["best"]["value"] and s_cut["best"]["trial"] == s_whole["best"]["trial"]
    # trial 0 was resumed from its checkpoint, not started over; no trial ran twice
    launches = json.loads((sweeps["cut"] / "trial-0000" / "run_info.json").read_text())["launches"]
    assert len(launches) == 2 and launches[1]["resumed_from"] and "set_aside" not in os.listdir(sweeps["cut"] / "trial-0000")
    assert sorted(p.name for p in sweeps["cut"].glob("trial-*")) == [f"trial-{i:04d}" for i in range(3)]


@pytest.mark.slow
def test_trials_are_run_folders_with_their_parameters_and_the_table_is_written(sweeps):
    folder, rows = sweeps["whole"], _trials(sweeps["whole"])
    for number, state, params, value, reported in rows:
        run = folder / f"trial-{number:04d}"
        cfg = json.loads(json.dumps(__import__("yaml").safe_load((run / "config.yaml").read_text())))
        assert cfg["train"]["lr"] == params["train.lr"] and cfg["train"]["batch_size"] == params["train.batch_size"]
        assert cfg["run_folder"] == str(run) and cfg["train"]["experiment"] == "s"
        evals = {r["step"]: r["eval"]["accuracy"] for r in records(run, "eval")}
        assert reported and all(evals[step] == v for step, v in reported.items())  # Optuna saw what validation saw
        if state == "COMPLETE":
            finished = [r for r in records(run, "all") if r.get("event") == "finished"][-1]
            assert value == finished["best"]["value"] == max(evals.values())
        else:  # pruned at a validation below the finished trials' median; Optuna keeps it as the trial's value
            assert value == reported[max(reported)]
    with open(folder / "trials.csv", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert [int(r["trial"]) for r in table] == [0, 1, 2]
    assert "| trial | state | train.lr | train.warmup_ratio | train.batch_size | accuracy |" in sweeps["stdout"]


def test_the_sweep_file_is_checked_naming_the_file_and_key(tmp_path, capsys):
    from pipeline.sweeps import study

    cfg = build_prepared(tmp_path)
    cases = {
        "name: a\ntrials: 2\nparams: {train.lrr: {low: 1, high: 2}}\n": r"params.train.lrr: unknown config key 'train.lrr'; did you mean 'train.lr'\?",
        "name: a\ntrials: 2\nparams: {train.lr: {low: 0.0, high: 1.0}}\n": r"params.train.lr: 0.0: train.lr must be > 0",
        "name: a\ntrials: 2\nparams: {train.lr: {low: 2.0, high: 1.0}}\n": r"params.train.lr: low \(2.0\) must be below high \(1.0\)",
        "name: a\ntrials: 2\nparams: {train.batch_size: {choices: [8, 0]}}\n": r"params.train.batch_size: 0: train.batch_size must be >= 1",
        "name: a\ntrials: 2\nparams: {tokenize.kind: {low: 1, high: 2}}\n": r"params.tokenize.kind: a range needs a number option",
        "name: a\ntrials: 0\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n": r"trials: expected at least 1, got 0",
        "name: a\ntrials: 2\nsampler: grid\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n": r"sampler: 'grid' is not one of 'tpe', 'random'",
        "name: a\ntrials: 2\nmetric: bleu\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n": r"metric: 'bleu' is not a validation metric of task classification",
        "name: a\ntrials: 2\nparam: {}\n": r"unknown key 'param'",
    }
    for text, message in cases.items():
        space = tmp_path / "space.yaml"
        space.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=rf"^{space}: {message}"):
            study.open_sweep(space, cfg, [])
    # sweep.py's main, as its process runs it (run_main): a bad --trials is one line and exit 2, nothing started
    from pipeline.cli import run_main
    from pipeline.sweep import main

    space.write_text(SPACE, encoding="utf-8")
    capsys.readouterr()
    with mock.patch.dict(os.environ), pytest.raises(SystemExit) as ended:
        run_main(lambda _: main(["--space", str(space), "--config", str(cfg), "--trials", "0"]))
    assert ended.value.code == 2 and capsys.readouterr().err == "error: --trials must be at least 1, got 0\n"
    assert not (cfg.parent / "out" / "sweeps").exists()


def test_a_sweep_folder_continues_only_the_sweep_it_started(tmp_path):
    from pipeline.sweeps import study

    cfg = build_prepared(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text("name: a\ntrials: 2\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n", encoding="utf-8")
    study.open_sweep(space, cfg, [])
    space.write_text("name: a\ntrials: 5\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n", encoding="utf-8")
    study.open_sweep(space, cfg, [])  # more trials: the same sweep, extended
    space.write_text("name: a\ntrials: 5\nparams: {train.lr: {low: 1.0e-5, high: 1.0e-3}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds a sweep started with another search space .*\(only `trials` may change\)"):
        study.open_sweep(space, cfg, [])
    with pytest.raises(ConfigError, match=r"holds a sweep started with another overrides"):
        space.write_text("name: a\ntrials: 5\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n", encoding="utf-8")
        study.open_sweep(space, cfg, ["train.epochs=3"])


@pytest.mark.slow
def test_two_sweep_processes_share_one_study_and_run_each_trial_once(tmp_path):
    """Two sweeps on one study at once (as machines sharing a database would; one of them in this process): the
    trials in all, each once. Two trials: each sweep asks while the other's trial runs (and, done, finds the
    other's trial running, locked, and none left to ask)."""
    cfg = build_prepared(tmp_path, train={"max_steps": 4, "eval_every": 2, "log_every": 2, "save_every": 2})
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.replace("pruner_startup_trials: 1", "pruner: none").replace("trials: 3", "trials: 2"),
                     encoding="utf-8")
    folder = cfg.parent / "out" / "sweeps" / "s"
    other = _start(cfg, space, tmp_path / "other.log")
    try:
        _wait(lambda: (folder / "sweep.json").is_file(), other)  # it has opened the study: both start together
        code, printed = _sweep_here(cfg, space)
    finally:
        other.wait(timeout=600)
    out = (tmp_path / "other.log").read_text(errors="replace")
    assert [other.returncode, code] == [0, 0], out[-2000:] + printed[-2000:]
    trials = _trials(folder)
    assert [t[0] for t in trials] == [0, 1] and {t[1] for t in trials} == {"COMPLETE"}
    started = [line.split(":")[0] for text in (out, printed) for line in text.splitlines() if line.startswith("trial ")
               and ": train.lr=" in line]
    assert sorted(started) == [f"trial {i}" for i in range(2)]  # each trial started by one process, once
    assert all(len(json.loads((folder / f"trial-{i:04d}" / "run_info.json").read_text())["launches"]) == 1
               for i in range(2))


def test_a_trials_score_is_its_best_validation_even_without_a_finished_record(tmp_path):
    """A trial killed after its last checkpoint but before its `finished` line resumes to nothing to do: its score
    comes from its validations, the earliest step on a tie (the best checkpoint's), in the metric's direction."""
    from pipeline.sweeps import study

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 1.0}, {"step": 2, "eval": {"accuracy": 0.5, "loss": 0.9}},
            {"step": 4, "eval": {"accuracy": 0.7, "loss": 0.8}}, {"step": 6, "eval": {"accuracy": 0.7, "loss": 0.85}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 7, "lo', encoding="utf-8")
    assert study._best(path, "accuracy", True) == {"step": 4, "value": 0.7}
    assert study._best(path, "loss", False) == {"step": 4, "value": 0.8}
    with pytest.raises(ValueError, match="without a validation of macro_f1"):
        study._best(path, "macro_f1", True)


def test_the_summary_names_no_best_trial_while_every_finished_trial_was_pruned(tmp_path):
    """Optuna gives a pruned trial its last reported value but never ranks it: best_trial would raise."""
    import optuna

    from pipeline.checks import load_config
    from pipeline.sweeps import study
    from pipeline.training import trackers

    optuna_study = optuna.create_study(direction="maximize")
    dist = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}
    trial = optuna_study.ask(dist)
    trial.report(0.4, 2)
    optuna_study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    spec = study.Spec(name="s", trials=2, params={})
    sweep = study.Sweep(spec, None, tmp_path / "c.yaml", [], tmp_path, dist, "accuracy", True, study=optuna_study)
    rows, summary = study._write_table(sweep)
    assert [r["state"] for r in rows] == ["pruned"] and summary["best"] is None
    cfg = load_config(build_prepared(tmp_path), [f"run_folder={tmp_path / 'trial-0003'}"])
    assert trackers.run_name(cfg) == "trial-0003"  # each trial's tracker run is named for its folder


def test_a_study_store_that_is_not_a_database_is_one_line_naming_it(tmp_path):
    """A study.db that is not a database was a 74-line sqlalchemy.exc.DatabaseError."""
    from pipeline.sweeps import study

    cfg = build_prepared(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text("name: a\ntrials: 2\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n", encoding="utf-8")
    db = cfg.parent / "out" / "sweeps" / "a" / "study.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a sqlite database, only some bytes " * 100)
    with pytest.raises(ValueError) as e:
        study.open_sweep(space, cfg, [])
    assert str(e.value).startswith(f"{db}: Optuna cannot open it as the study's storage (DatabaseError: ")
    assert str(e.value).endswith("; move it away to start the sweep anew, or give the sweep another name")
    assert "\n" not in str(e.value) and db.read_bytes().startswith(b"this is not")  # named, not replaced


@pytest.mark.slow
def test_trials_that_stop_early_are_scored_by_their_best_validation_and_the_pruner_still_ranks_them(tmp_path):
    """Early stopping inside a sweep: each trial (patience 1, a delta no validation beats, validations every 2
    steps) stops at its second validation, step 4 of 8, with exit 0; the sweep records it COMPLETE with its best
    validation as its value and the values it reported, and names a best trial. The pruner and early stopping
    each end a trial by their own rule; neither turns the other's end into a failure."""
    space = tmp_path / "space.yaml"
    space.write_text("name: s\ntrials: 2\nseed: 3\nparams:\n  train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}\n",
                     encoding="utf-8")
    cfg = build_prepared(tmp_path, train={"max_steps": 8, "eval_every": 2, "log_every": 1, "save_every": 0,
                                          "early_stopping_patience": 1, "early_stopping_delta": 1.0})
    code, printed = _sweep_here(cfg, space)
    assert code == 0, printed[-3000:]
    folder = cfg.parent / "out" / "sweeps" / "s"
    trials = _trials(folder)
    assert [t[1] for t in trials] == ["COMPLETE", "COMPLETE"]
    from pipeline.checks import load_config
    from pipeline.sweeps import study

    for number, _, _, value, reported in trials:
        run = folder / f"trial-{number:04d}"
        stopped = [r for r in records(run, "all") if r.get("event") == "early_stopped"]
        assert [r["stopped_at"] for r in stopped] == [4] and sorted(reported) == [2, 4]
        metric = load_config(cfg).train.metric_for_best
        assert value == study._best(run / "metrics.jsonl", metric, True)["value"]
    best = min(trials, key=lambda t: (-t[3], t[0]))  # the highest value, the first trial on a tie
    assert f"trial-{best[0]:04d}/config.yaml --checkpoint best" in printed  # the summary names a best trial
