"""Hyperparameter sweeps: N trials of train.py (one process each, every one a normal run folder) over a search
space in YAML, with Optuna's samplers, its median pruner and its RDB storage in a sqlite file.

  <output_dir>/sweeps/<name>/
    sweep.json        the space, the base config and overrides it was started with (a rerun must match)
    study.db          Optuna's storage: every trial's parameters, reported validation values and state
    trial-0000/ ...   each trial's run folder (run_folder=...): checkpoints, metrics.jsonl, final/, trackers
    trials.csv        one row per trial, rewritten after each; summary.json: the best trial

Killed at any moment (SIGKILL included), the same command continues: finished trials are kept, a trial left
RUNNING by this machine is resumed from its last checkpoint (`train.py --resume auto`, exact as any resume),
and no trial runs twice. Trial k's parameters are drawn by a sampler seeded with (seed, k) from the trials
finished before it, so an interrupted sweep draws what an uninterrupted one of the same seed draws.
"""

from __future__ import annotations

import csv
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline import artifacts, tasks
from pipeline.checks import load_config
from pipeline.config import REPO_ROOT, Config, ConfigError, override
from pipeline.sweeps.space import Spec, distributions, read_spec
from pipeline.training.rundir import read_records

EXIT_INTERRUPTED = 75  # as train.py: stopped by a signal; rerun the same command to continue


# ---------------------------------------------------------------- the sweep


@dataclass
class Sweep:
    spec: Spec
    cfg: Config
    config_path: Path
    overrides: list[str]
    folder: Path
    dists: dict
    metric: str
    greater: bool
    study: Any = None
    child: subprocess.Popen | None = None
    stopping: str = ""

    def trial_folder(self, number: int) -> Path:
        return self.folder / f"trial-{number:04d}"


def open_sweep(spec_path: Path, config_path: Path, overrides: list[str], trials: int | None = None,
               storage: str = "") -> Sweep:
    import optuna

    spec = read_spec(spec_path)
    if trials is not None:
        if trials < 1:
            raise ConfigError(f"--trials must be at least 1, got {trials}")
        spec = replace(spec, trials=trials)
    cfg = load_config(config_path, overrides)
    metric = spec.metric or cfg.train.metric_for_best
    task = tasks.get(cfg.task)
    if metric not in task.metrics:
        raise ConfigError(f"{spec_path}: metric: {metric!r} is not a validation metric of task {cfg.task} "
                          f"({', '.join(task.metrics)})")
    dists = distributions(spec, config_path, overrides, str(spec_path))
    folder = Path(cfg.output_dir) / "sweeps" / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(spec, cfg, config_path, overrides, folder, dists, metric, task.metrics[metric])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage or f"sqlite:///{(folder / 'study.db').resolve()}"
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with artifacts.locked(folder / ".ask.lock"):  # sweeps started at once on this machine: one creates the study's tables
        _check_same_sweep(folder, spec, config_path, overrides)
        sweep.study = _open_study(optuna, url, kwargs, spec, sweep.greater, folder)
    return sweep


def _open_study(optuna, url: str, engine_kwargs: dict, spec: Spec, greater: bool, folder: Path):
    """The study in Optuna's storage at `url`; a store that is not one (a study.db that is not a database, a
    server that refuses) is one line naming it."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        return optuna.create_study(study_name=spec.name, storage=rdb, load_if_exists=True,
                                   direction="maximize" if greater else "minimize", pruner=_pruner(spec))
    except (SQLAlchemyError, optuna.exceptions.OptunaError) as e:
        where = folder / "study.db" if url.startswith(f"sqlite:///{folder.resolve()}") else url
        reason = " ".join(str(e).split("\n")[0].split())[:200]
        raise ValueError(f"{where}: Optuna cannot open it as the study's storage ({type(e).__name__}: {reason}); "
                         f"move it away to start the sweep anew, or give the sweep another name") from None


def _check_same_sweep(folder: Path, spec: Spec, config_path: Path, overrides: list[str]) -> None:
    """A sweep folder continues only the sweep it was started with: the same space, config file and overrides."""
    record = {"spec": {k: v for k, v in spec.source.items() if k != "trials"}, "config": str(config_path),
              "config_text": config_path.read_text(encoding="utf-8"), "overrides": overrides}
    path = folder / "sweep.json"
    if path.is_file():
        have = artifacts.read_json(path)
        for key, what in (("spec", "search space"), ("config_text", "config file"), ("overrides", "overrides")):
            if have.get(key) != record[key]:
                raise ConfigError(f"{folder} holds a sweep started with another {what} ({path}); rerun it as it "
                                  f"was started (only `trials` may change), or give the sweep another name")
        return
    artifacts.write_json_atomic(path, record)


def _pruner(spec: Spec):
    import optuna

    if spec.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner_startup_trials,
                                       n_warmup_steps=spec.pruner_warmup_steps)


def _sampler(spec: Spec, number: int):
    """A sampler seeded by (seed, trial number): trial k's draw depends on the trials finished before it only,
    not on how many times the sweep was restarted (a sampler's own random state would)."""
    import optuna

    seed = (spec.seed * 1_000_003 + number) % 2**32
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)


def run(sweep: Sweep) -> int:
    """Trials until the sweep has spec.trials of them; 0, or 75 when stopped by a signal."""
    import optuna

    host = socket.gethostname()
    previous = {s: signal.signal(s, _stopper(sweep)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not sweep.stopping:
            frozen, lock = _next_trial(sweep, host)
            if frozen is None:
                break
            try:
                trial = optuna.trial.Trial(sweep.study, frozen._trial_id)
                for name, dist in sweep.dists.items():  # what a kill inside ask() left unstored: the enqueued values
                    _suggest(trial, name, dist)
                _run_trial(sweep, trial, sweep.study.get_trials(deepcopy=False)[frozen.number])
            finally:
                _unlock(lock)
            _write_table(sweep)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    rows, summary = _write_table(sweep)
    if sweep.stopping:
        print(f"sweep stopped by {sweep.stopping}; rerun the same command to continue (exit {EXIT_INTERRUPTED})",
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    _print_table(sweep, rows, summary)
    return 0


def _next_trial(sweep: Sweep, host: str):
    """(trial, its folder's lock): a trial this machine left running (resumed), a waiting one, or a new one;
    (None, None) when the sweep has all its trials.

    A new trial's parameters are drawn in a scratch in-memory study holding the finished trials, by a sampler
    seeded with (seed, trial number), and enqueued before the real study's ask() takes them: a kill at any point
    leaves either nothing, a waiting trial, or a running one whose parameters are fixed, never a second draw."""
    from optuna.trial import TrialState

    with artifacts.locked(sweep.folder / ".ask.lock"):  # sweep processes on this machine pick their next trial one at a time
        trials = sweep.study.get_trials(deepcopy=False)
        for t in trials:  # a trial killed before its host label is this machine's too
            if t.state == TrialState.RUNNING and t.user_attrs.get("host", host) == host:
                lock = _try_lock(sweep.trial_folder(t.number))  # None: a live sweep on this machine runs it
                if lock is not None:
                    return t, lock
        if not any(t.state == TrialState.WAITING for t in trials):
            if len(trials) >= sweep.spec.trials:  # finished, failed, or running elsewhere: each counts once
                return None, None
            sweep.study.enqueue_trial(_draw(sweep, trials), user_attrs={"host": host})
        trial = sweep.study.ask(sweep.dists)  # the oldest waiting trial, with its enqueued parameters
        trial.set_user_attr("host", host)
        lock = _try_lock(sweep.trial_folder(trial.number))
    return sweep.study.get_trials(deepcopy=False)[trial.number], lock


def _draw(sweep: Sweep, trials: list) -> dict:
    import optuna
    from optuna.trial import TrialState

    scratch = optuna.create_study(direction=sweep.study.direction, sampler=_sampler(sweep.spec, len(trials)))
    scratch.add_trials([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)])
    return scratch.ask(sweep.dists).params


def _suggest(trial, name: str, dist) -> Any:
    import optuna.distributions as od

    if isinstance(dist, od.CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, od.IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def _stopper(sweep: Sweep):
    def handler(signum, frame):
        sweep.stopping = signal.Signals(signum).name
        if sweep.child is not None and sweep.child.poll() is None:
            sweep.child.send_signal(signal.SIGTERM)  # train.py saves a checkpoint and exits 75
    return handler


def _try_lock(folder: Path):
    """An exclusive lock on the trial folder for as long as this process runs it (released by the kernel when the
    process dies, SIGKILL included); None when another live sweep process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".sweep.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd) -> None:
    if fd is not None:
        os.close(fd)


def trial_overrides(sweep: Sweep, number: int, params: dict) -> list[str]:
    """The trial's command line: the sweep's overrides, its parameters, its folder, and the sweep's metric as the
    one that ranks its checkpoints (so its `best` checkpoint is the one the sweep scored)."""
    return [*sweep.overrides, *(override(k, v) for k, v in params.items()),
            f"run_folder={sweep.trial_folder(number)}", f"train.experiment={sweep.spec.name}",
            f"train.metric_for_best={sweep.metric}"]


def _die_with_parent() -> None:
    """In the trial's process: SIGKILL when the sweep process dies, so that a killed sweep leaves no trainer
    writing into a trial folder the next sweep resumes (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _run_trial(sweep: Sweep, trial, frozen) -> None:
    """Train (or resume) one trial, reporting each validation to Optuna and stopping it when pruned."""
    from optuna.trial import TrialState

    number, params = frozen.number, frozen.params
    folder = sweep.trial_folder(number)
    cmd = [sys.executable, str(REPO_ROOT / "pipeline" / "train.py"), "--config", str(sweep.config_path),
           "--resume", "auto", *trial_overrides(sweep, number, params)]
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    resumed = (folder / "checkpoints").is_dir()
    print(f"trial {number}: {shown}{' (resumed)' if resumed else ''}", flush=True)
    reported = set(frozen.intermediate_values)
    if reported and trial.should_prune():  # pruned before a kill, told nothing yet
        sweep.study.tell(number, state=TrialState.PRUNED)
        print(f"trial {number}: pruned at step {max(reported)}", flush=True)
        return
    env = dict(os.environ)
    if "mlflow" in sweep.cfg.train.report_to:  # the trials of one sweep in one MLflow store, comparable
        env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{(sweep.folder / 'mlflow.db').resolve()}")
    log = open(folder / "train.log", "a", encoding="utf-8")
    started = time.monotonic()
    sweep.child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd(),
                                   preexec_fn=_die_with_parent)
    pruned_at = None
    try:
        while True:
            code = sweep.child.poll()
            for step, value in _validations(folder / "metrics.jsonl", sweep.metric):
                if pruned_at is not None:
                    break
                if step not in reported:  # a resumed trial's redone validations were reported before its stop
                    trial.report(value, step)
                    reported.add(step)
                    if trial.should_prune():
                        pruned_at = step
                        sweep.child.send_signal(signal.SIGTERM)  # saves a checkpoint; the trial stays resumable
            if code is not None:
                break
            time.sleep(0.5)
    finally:
        log.close()
    sweep.child, seconds = None, time.monotonic() - started
    trial.set_user_attr("seconds", frozen.user_attrs.get("seconds", 0.0) + seconds)
    if pruned_at is not None:
        sweep.study.tell(number, state=TrialState.PRUNED)
        print(f"trial {number}: pruned at step {pruned_at}", flush=True)
    elif code == 0:
        best = _best(folder / "metrics.jsonl", sweep.metric, sweep.greater)
        trial.set_user_attr("best_step", best["step"])
        trial.set_user_attr("steps", _last_step(folder / "metrics.jsonl"))
        sweep.study.tell(number, best["value"])
        print(f"trial {number}: {sweep.metric} {best['value']:.6g} (best at step {best['step']})", flush=True)
    elif code == EXIT_INTERRUPTED or sweep.stopping:
        return  # left RUNNING: the next run of the sweep resumes it
    else:
        last = _last_line(folder / "train.log")
        trial.set_user_attr("error", last)
        sweep.study.tell(number, state=TrialState.FAIL)
        print(f"trial {number}: failed (exit {code}): {last}; see {folder / 'train.log'}", flush=True)


def _validations(path: Path, metric: str) -> list[tuple[int, float]]:
    return [(r["step"], r["eval"][metric]) for r in read_records(path) if isinstance(r.get("eval"), dict)
            and metric in r["eval"]]


def _best(path: Path, metric: str, greater: bool) -> dict:
    """The trial's best validation of the sweep's metric, the earliest step on a tie (as checkpoint rotation,
    `--checkpoint best` and state.json's best rank them); from the validations themselves, so a run killed after its last checkpoint but before its `finished`
    record (resumed: nothing to do) is scored the same."""
    by_step = dict(_validations(path, metric))
    if not by_step:
        raise ValueError(f"{path}: the trial finished without a validation of {metric}")
    step = max(by_step, key=lambda s: (by_step[s] if greater else -by_step[s], -s))
    return {"step": step, "value": by_step[step]}


def _last_step(path: Path) -> int:
    return max((r["step"] for r in read_records(path) if "step" in r), default=0)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# ---------------------------------------------------------------- the table


def table(sweep: Sweep) -> list[dict]:
    rows = []
    for t in sweep.study.get_trials(deepcopy=False):
        rows.append({"trial": t.number, "state": t.state.name.lower(), **t.params,
                     sweep.metric: t.value if t.value is not None else "",
                     "last_reported": (t.intermediate_values[max(t.intermediate_values)]
                                       if t.intermediate_values else ""),
                     "steps": t.user_attrs.get("steps", max(t.intermediate_values, default="")),
                     "minutes": round(t.user_attrs.get("seconds", 0.0) / 60, 2),
                     "folder": str(sweep.trial_folder(t.number))})
    return rows


def _write_table(sweep: Sweep) -> tuple[list[dict], dict | None]:
    """trials.csv and summary.json; the rows and the summary, for printing."""
    rows = table(sweep)
    if not rows:
        return rows, None
    tmp = sweep.folder / "trials.csv.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, sweep.folder / "trials.csv")
    complete = [t for t in sweep.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    best = sweep.study.best_trial if complete else None  # a pruned trial has a value, but Optuna never ranks it
    summary = {
        "name": sweep.spec.name, "metric": sweep.metric, "direction": "maximize" if sweep.greater else "minimize",
        "trials": len(rows), "states": {s: sum(r["state"] == s for r in rows) for s in {r["state"] for r in rows}},
        "best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params,
                                           "folder": str(sweep.trial_folder(best.number))},
    }
    artifacts.write_json_atomic(sweep.folder / "summary.json", summary)
    return rows, summary


def _print_table(sweep: Sweep, rows: list[dict], summary: dict | None) -> None:
    keys = ["trial", "state", *sweep.dists, sweep.metric, "steps", "minutes"]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    if summary and summary["best"]:
        b = summary["best"]
        print(f"best: trial {b['trial']}, {sweep.metric} {b['value']:.6g}, {b['params']}; its best checkpoint: "
              f"python pipeline/evaluate.py --config {b['folder']}/config.yaml --checkpoint best --split test")
