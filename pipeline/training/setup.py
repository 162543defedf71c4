"""Everything before the first step: checks (all before any work), building, and resuming."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.config import Config
from pipeline.training import batching, budget, build, checkpoint, rundir

# train settings that do not change the sequence of updates: free to change on resume
FREE_ON_RESUME = {"epochs", "max_steps", "eval_every", "save_every", "save_at_epoch_end", "keep_last", "keep_best",
                  "log_every", "metric_for_best", "nan_policy", "max_nan_in_a_row", "num_workers", "allow_slow_bf16",
                  "collective_timeout_s", "detect_anomaly", "max_minutes"}  # a budget's steps are kept on resume


@dataclass
class Position:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed (per rank)


@dataclass
class Setup:
    cfg: Config
    acc: Any
    model: Any
    optimizer: Any
    scheduler: Any
    tok: Any
    train_ds: Any
    val_ds: Any
    lengths: Any  # numpy int array: tokens per train row
    collate: batching.Collator
    label_names: list
    run_dir: Path
    total_steps: int
    steps_per_epoch: int
    fingerprints: dict
    log: rundir.MetricsLog
    config_path: str
    pos: Position = field(default_factory=Position)
    best: dict = field(default_factory=dict)
    nan: dict = field(default_factory=lambda: {"skipped_total": 0, "in_a_row": 0})
    stop_requested: bool = False
    last_lr: float = 0.0
    last_norm: float = 0.0
    last_metrics: tuple | None = None
    saved_step: int = -1
    saved_name: str = ""
    budget: dict | None = None  # train.max_minutes: what was measured and decided (budget.py)

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"


def _fingerprints(cfg: Config, data_fp: str, mp: str) -> dict:
    train = {k: v for k, v in asdict(cfg.train).items() if k not in FREE_ON_RESUME}
    train["mixed_precision"] = mp
    return {"model": artifacts.fingerprint(asdict(cfg.model)), "data": data_fp, "train": train}


def check_resumable(state: dict, fps: dict, world: int, path: Path) -> None:
    """A checkpoint from another model, data or batching is an error, never garbage. The number of
    processes may change (elastic resume) while train.batch_size x processes stays the same: then the
    global batch and the data order of every epoch (a function of the seed and that product) are too."""
    old = state.get("fingerprints", {})
    for key, what in (("model", "the [model] section"), ("data", "the prepared data")):
        if old.get(key) != fps[key]:
            raise ValueError(f"{path} was trained with other {what} (fingerprint {old.get(key)} != {fps[key]}); "
                             f"resume with the config it was made with, or start a new output_dir")
    old_train, new_train = old.get("train", {}), fps["train"]
    _check_global_batch(old_train, state.get("num_processes"), new_train, world, path)
    changed = sorted(k for k in new_train if k != "batch_size" and old_train.get(k) != new_train[k])
    if changed:
        diffs = ", ".join(f"train.{k}: {old_train.get(k)!r} -> {new_train[k]!r}" for k in changed)
        raise ValueError(f"{path}: these settings differ from the checkpoint's and would change the run: {diffs}")


def _check_global_batch(old: dict, old_world, new: dict, world: int, path: Path) -> None:
    """batch_size x processes x grad_accum must stay (grad_accum itself is compared with the other settings)."""
    was = [old.get("batch_size") or 0, old_world or 0, old.get("grad_accum") or 1]
    now = [new["batch_size"], world, new.get("grad_accum", 1)]
    if math.prod(was) == math.prod(now):
        return
    per_rank, rest = divmod(math.prod(was), world * now[2])
    hint = (f"with {world} process(es) use train.batch_size={per_rank}" if not rest and per_rank
            else f"no train.batch_size gives it with {world} process(es) at train.grad_accum={now[2]}")
    raise ValueError(f"{path}: global batch {' x '.join(map(str, was))} (batch_size x processes x grad_accum) = "
                     f"{math.prod(was)} in the checkpoint, {' x '.join(map(str, now))} = {math.prod(now)} in this run; "
                     f"resume at the checkpoint's global batch ({hint}) or start a new output_dir")


def _resolve_resume(acc, run_dir: Path, resume: str | None, config_path: str) -> Path | None:
    root = run_dir / "checkpoints"
    if resume is None:
        return None
    if resume != "auto":
        reason = checkpoint.verify(Path(resume), deep=True)
        if reason:
            raise ValueError(f"--resume {resume}: {reason}")
        return Path(resume)
    path, warnings = checkpoint.find_resume(root)
    if acc.is_main_process:
        for w in warnings:
            checkpoint.warn(w)
    if path is None:
        rundir.check_fresh_start(run_dir, config_path)
        if acc.is_main_process:
            print(f"--resume auto: no complete checkpoint in {root}; starting fresh", flush=True)
    return path


def _load_data(cfg: Config, config_path: str):
    from pipeline.data.prepared import load_prepared, prepare_command

    prep = load_prepared(cfg, config_path)
    for split in ("train", "validation"):
        missing = {"input_ids", "label", "length"} - set(prep.splits[split].column_names) if split in prep.splits else {"split"}
        if missing:
            raise ValueError(f"prepared data in {cfg.data_dir} lacks {split} {sorted(missing)}; "
                             f"rerun `{prepare_command(cfg, config_path)}`")
    if len(prep.splits["validation"]) == 0:  # validation picks the best checkpoint and reports progress
        raise ValueError(f"the prepared validation split in {cfg.data_dir} is empty (split.validation="
                         f"{cfg.split.validation}); training evaluates on it: set split.validation above 0 and rerun "
                         f"prepare")
    return prep


def prepare_run(cfg: Config, config_path: str, resume: str | None, restart: bool = False) -> Setup | None:
    """Check, build and (when resuming) restore. None: resumed after the last step, nothing to do."""
    import time

    import numpy as np
    import torch
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    from pipeline.accel import make_accelerator

    started = time.perf_counter()  # train.max_minutes counts from here
    t, run_dir = cfg.train, cfg.run_dir
    mp = build.choose_precision(t, torch.cuda.is_available())
    if not restart:
        rundir.check_run_dir(run_dir, resume, config_path)
    prep = _load_data(cfg, config_path)
    tok = build.load_tokenizer(prep.tokenizer_dir, cfg.model.from_scratch)
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=t.collective_timeout_s))  # gloo's default: 30 min
    acc = make_accelerator(mixed_precision=mp, gradient_accumulation_steps=t.grad_accum, log_with="tensorboard",
                           project_dir=str(run_dir), kwargs_handlers=[timeout])
    train_ds = prep.splits["train"]
    spe = batching.steps_per_epoch(len(train_ds), t.batch_size, acc.num_processes, t.grad_accum)
    if spe == 0:
        per_step = t.batch_size * acc.num_processes * t.grad_accum
        raise ValueError(f"train.batch_size={t.batch_size} x {acc.num_processes} processes x train.grad_accum="
                         f"{t.grad_accum} = {per_step} examples per step, but the train split has {len(train_ds)} "
                         f"rows: zero steps per epoch; lower train.batch_size or train.grad_accum")
    total = t.max_steps or t.epochs * spe
    fps = _fingerprints(cfg, prep.fingerprint, mp)
    ckpt = None if restart else _resolve_resume(acc, run_dir, resume, config_path)
    state = artifacts.read_json(ckpt / checkpoint.STATE) if ckpt else None
    if state:
        check_resumable(state, fps, acc.num_processes, ckpt)
        if t.max_minutes:  # the budget's step count was fixed at the first launch
            total = state.get("total_steps") or total
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_seed(t.seed, deterministic=t.deterministic)
    model = build.build_model(cfg, tok, prep.label_names)
    build.check_fit(model, tok, train_ds, cfg.tokenize.max_length, f"model {cfg.model.name_or_path or cfg.model.from_scratch}")
    if t.gradient_checkpointing:  # non-reentrant: works under DDP (no "marked ready twice")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer, scheduler = build.build_optimizer(model, t, total)
    model, optimizer = acc.prepare(model, optimizer)  # the scheduler stays ours: stepped once per step
    if ckpt is None and acc.is_main_process and rundir.holds_run(run_dir):
        moved = rundir.set_aside(run_dir)
        if moved:
            print(f"the earlier attempt's files were moved to {moved} (nothing was deleted)", flush=True)
    acc.wait_for_everyone()
    s = Setup(cfg=cfg, acc=acc, model=model, optimizer=optimizer, scheduler=scheduler, tok=tok, train_ds=train_ds,
              val_ds=prep.splits["validation"], lengths=np.asarray(train_ds["length"][:], dtype=np.int64),
              collate=batching.Collator(tok.pad_token_id, batching.pad_multiple(acc.device.type, t.pad_to_multiple_of),
                                               cfg.tokenize.max_length),
              label_names=prep.label_names, run_dir=run_dir, total_steps=total, steps_per_epoch=spe,
              fingerprints=fps, config_path=config_path, log=rundir.MetricsLog(run_dir / "metrics.jsonl", acc.is_main_process,
                                                      state["step"] if state else None))
    if t.max_minutes:
        s.budget = budget.fix_total_steps(s, started) if state is None else budget.kept(s, ckpt)
    s.best = {"metric": t.metric_for_best, "greater_is_better": t.metric_for_best != "loss", "value": None, "step": None}
    _start_position(s, ckpt, state)
    if state and state["step"] >= total:
        return _nothing_to_do(s, ckpt, state)
    _announce(s, ckpt, model, mp)
    return s


def _start_position(s: Setup, ckpt: Path | None, state: dict | None) -> None:
    s.pos = Position()
    if ckpt is None:
        return
    if state.get("total_steps") != s.total_steps and s.acc.is_main_process:
        checkpoint.warn(f"total steps changed from {state.get('total_steps')} to {s.total_steps}: the learning-rate "
                        f"schedule differs from the original run's from here on")
    checkpoint.load_checkpoint(s.acc, ckpt, s.model, s.optimizer, s.scheduler)  # RNG last: nothing draws after
    s.pos = Position(step=state["step"], epoch=state["epoch"], batch_in_epoch=state["batch_in_epoch"])
    s.best.update({k: v for k, v in state.get("best", {}).items() if k in ("value", "step")})
    s.nan.update(state.get("nan", {}))
    s.saved_step, s.saved_name = state["step"], ckpt.name


def _nothing_to_do(s: Setup, ckpt: Path, state: dict) -> None:
    weights = s.acc.get_state_dict(s.model)  # the full state dict: a collective under FSDP/ZeRO-3
    if s.acc.is_main_process:
        print(f"--resume: {ckpt} is at {checkpoint.describe_state(state)}, the end of a {s.total_steps}-step run; "
              f"nothing to do", flush=True)
        if not (s.run_dir / "final" / "config.json").is_file():
            rundir.export_final(s.acc.unwrap_model(s.model), s.tok, s.run_dir / "final", weights=weights)
            print(f"exported the final model to {s.run_dir / 'final'}", flush=True)
    s.acc.wait_for_everyone()
    return None


def _announce(s: Setup, ckpt: Path | None, model, mp: str) -> None:
    acc = s.acc
    if acc.is_main_process:
        rundir.record_launch(s.cfg, s.run_dir, {
            "num_processes": acc.num_processes, "mixed_precision": mp, "resumed_from": str(ckpt) if ckpt else None,
            "model": build.describe(acc.unwrap_model(model)), "fingerprints": s.fingerprints, "budget": s.budget,
        })
        if not (s.run_dir / "model_config" / "config.json").is_file():
            rundir.export_model_config(acc.unwrap_model(model), s.tok, s.run_dir / "model_config")
        where = f"resuming from {ckpt} at {checkpoint.describe_state({**vars(s.pos)})}" if ckpt else "starting fresh"
        print(f"{build.describe(acc.unwrap_model(model))}; {acc.num_processes} process(es), precision {mp}; "
              f"{s.steps_per_epoch} steps/epoch, {s.total_steps} steps; {where}", flush=True)
    acc.init_trackers("tensorboard")
    acc.wait_for_everyone()
