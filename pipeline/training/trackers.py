"""Experiment trackers (`train.report_to`): TensorBoard, MLflow, Weights & Biases and Aim, through accelerate's
tracker classes. Every one writes inside the run folder by default and works offline:

  <run>/tensorboard/    event files                      <run>/mlflow.db, mlflow-artifacts/   MLflow (sqlite)
  <run>/wandb/          offline runs (`wandb sync` them)  <run>/.aim/                          an Aim repository
  <run>/trackers.json   each tracker's run id: a resume and evaluate.py continue the same tracker run

They receive what metrics.jsonl receives (train/* every log_every steps, per-rank losses included; eval/* at each
validation), the resolved config as parameters at the first launch, best/<metric> at the end, and evaluate.py's
<split>/<metric>. A resume redoes the steps after its checkpoint and logs them again with the values they had
(exact resume); a reader keeps the last value per step, as metrics.jsonl does.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline import artifacts

# report_to name -> (module that must be importable, the pip extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", ""), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb"),
            "aim": ("aim", "aim")}
IDS = "trackers.json"
MLFLOW_DB = "mlflow.db"
# where each tracker keeps its runs in the run folder, and whether that is a folder (True) or a file
STORES = {"tensorboard": ("tensorboard", True), "mlflow": (MLFLOW_DB, False), "wandb": ("wandb", True),
          "aim": (".aim", True)}


def check_installed(report_to: list) -> None:
    """Before any work: a tracker that is not installed is one line naming its extra."""
    for name in report_to:
        module, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"train.report_to: {name} is not installed; pip install -c constraints.txt -e "
                             f"'.[{extra or name}]' (or drop {name} from train.report_to)")


def experiment_name(cfg) -> str:
    return cfg.train.experiment or Path(cfg.output_dir).resolve().name


def run_name(cfg) -> str:
    """The tracker run's name: the run folder's where it is set (a sweep's trial-NNNN), else output_dir's."""
    return Path(cfg.run_folder).name if cfg.run_folder else Path(cfg.output_dir).resolve().name


def params(cfg) -> dict[str, Any]:
    """The resolved config as `section.key` scalars (lists and mappings as JSON): every tracker's parameter types."""
    from pipeline.config import flat

    return {k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v for k, v in flat(cfg.to_dict()).items()}


def mlflow_uri(run_dir: Path) -> str:
    """MLFLOW_TRACKING_URI where set (a server, or a database shared by a sweep), else a sqlite file in the run."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"


def read_ids(run_dir: Path) -> dict:
    path = run_dir / IDS
    try:
        return artifacts.read_json(path) if path.is_file() else {}
    except ValueError:
        return {}


def _make(name: str, cfg, run_dir: Path, run_id: str | None):
    import accelerate.tracking as at

    project = experiment_name(cfg)
    if name == "tensorboard":
        return at.TensorBoardTracker("tensorboard", run_dir)  # <run>/tensorboard, as before report_to existed
    if name == "mlflow":
        import mlflow

        before = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(mlflow_uri(run_dir))
        # mlflow also exports the URI to os.environ (for its subprocesses): put it back, or the next run in this
        # process (evaluate after train, a sweep's trials, a test) would report into this run's database
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        return at.MLflowTracker(project, str((run_dir / "mlflow-artifacts").resolve()), run_id=run_id,
                                run_name=run_name(cfg))
    if name == "wandb":
        import wandb

        # its log is written every x_transaction_log_flush_interval seconds (15 by default): what a SIGKILL
        # can lose; wandb has no flush call for a checkpoint to make
        return at.WandBTracker(project, mode=os.environ.get("WANDB_MODE", "offline"), dir=str(run_dir),
                               id=run_id, resume="allow", name=run_name(cfg),
                               settings=wandb.Settings(console="off", silent=True, x_transaction_log_flush_interval=1.0))
    if name == "aim":  # no terminal capture or system sampling threads: the run's stdout stays ours
        return at.AimTracker(project, str(run_dir), run_hash=run_id, experiment=project,
                             capture_terminal_logs=False, system_tracking_interval=None, log_system_params=False)
    raise ValueError(f"train.report_to: unknown tracker {name!r}")


def _run_id(tracker) -> str | None:
    name = tracker.name
    if name == "mlflow":
        return tracker.active_run.info.run_id
    if name == "wandb":
        return tracker.run.id
    if name == "aim":
        return tracker.writer.hash
    return None


def open_trackers(cfg, run_dir: Path, fresh: bool) -> list:
    """The config's trackers started on this (main) process: a fresh run's get new tracker runs and the config
    as parameters; otherwise each continues the tracker run trackers.json names. Their ids are saved."""
    ids = {} if fresh else read_ids(run_dir)
    config = params(cfg) if fresh else None
    started = []
    for name in cfg.train.report_to:
        _check_store(name, run_dir)
        try:
            tracker = _make(name, cfg, run_dir, ids.get(name))
            tracker.start()
            if config is not None:
                tracker.store_init_configuration(config)
        except Exception as e:  # noqa: BLE001 - no login, a server that does not answer: one line, not a traceback
            for t in started:
                t.finish()
            raise ValueError(f"train.report_to: {name} could not start: {_reason(e)} (drop it from "
                             f"train.report_to, or fix its setup)") from None
        started.append(tracker)
    kept = {t.name: run_id for t in started if (run_id := _run_id(t))}
    if kept != {k: ids.get(k) for k in kept}:
        artifacts.write_json_atomic(run_dir / IDS, {**ids, **kept})
    return started


def _check_store(name: str, run_dir: Path) -> None:
    """Before a tracker starts: its store in the run folder, where one exists, is the kind it can open (Aim read a
    file named .aim as a repository and failed with an empty RuntimeError)."""
    if name == "mlflow" and os.environ.get("MLFLOW_TRACKING_URI"):
        return  # a server or a shared database, not the run folder's file
    rel, folder = STORES[name]
    path = run_dir / rel
    if path.exists() and path.is_dir() != folder:
        have, want = ("a folder", "a file") if path.is_dir() else ("a file", "a folder")
        raise ValueError(f"train.report_to: {name} keeps its runs in {path}, which is {have}, not {want}; move it "
                         f"away (or drop {name} from train.report_to)")


def _reason(e: BaseException) -> str:
    """An exception in one line: its type and message, or where it has none, the first one behind it that has."""
    chain, seen = e, []
    while chain is not None and chain not in seen:
        seen.append(chain)
        text = " ".join(str(chain).split())
        if text:
            return f"{type(e).__name__}: {text[:300]}" if chain is e else \
                f"{type(e).__name__} ({type(chain).__name__}: {text[:300]})"
        chain = chain.__cause__ or (None if chain.__suppress_context__ else chain.__context__)
    return f"{type(e).__name__} (no message)"


def start(acc, cfg, run_dir: Path, fresh: bool) -> None:
    """The training run's trackers, on the main process; accelerate's log() and end_training() then reach them."""
    if acc.is_main_process:
        acc.trackers.extend(open_trackers(cfg, run_dir, fresh))


def flush(acc) -> None:
    """After a checkpoint: what the trackers hold of the run up to it goes to disk, so a SIGKILL after the
    checkpoint loses none of it (TensorBoard's writer otherwise flushes every 2 minutes; MLflow's sqlite and
    Aim's RocksDB write as they log)."""
    for tracker in acc.trackers if acc.is_main_process else ():
        if tracker.name == "tensorboard":
            tracker.writer.flush()


def numbers(tree: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested metrics dict, keyed by path (`chunk/per_class/negative/f1`); lists, text and
    versions left out."""
    out: dict[str, float] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and k != "versions":
            out.update(numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = v
    return out


def log_evaluation(cfg, run_dir: Path, metrics: dict, step: int | None) -> None:
    """evaluate.py's figures, `<split>/<metric>`, into the tracker runs the training run opened (main process)."""
    if not run_dir.is_dir():
        return
    # the trackers the training run reported to (trackers.json) and the config's; TensorBoard has its own files
    # (eval/<split>-<checkpoint>/tensorboard). One no longer installed is passed over, not an error.
    ids = read_ids(run_dir)
    named = [n for n in TRACKERS if n != "tensorboard" and (n in ids or n in cfg.train.report_to)
             and importlib.util.find_spec(TRACKERS[n][0]) is not None]
    if not named:
        return
    values = {f"{metrics['split']}/{k}": v for k, v in numbers(metrics).items()
              if k not in ("step", "processes", "batch_size")}
    for tracker in open_trackers(replace(cfg, train=replace(cfg.train, report_to=named)), run_dir, fresh=False):
        tracker.log(values, step=step)
        tracker.finish()
