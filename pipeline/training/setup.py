"""Everything before the first step: checks (all before any work), building, and resuming."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from pipeline import accel, artifacts, tasks
from pipeline.config import Config, TrainConfig
from pipeline.inference import backends, padding
from pipeline.models import lora
from pipeline.training import audit, batching, budget, build, card, checkpoint, rundir, trackers
from pipeline.training.state_io import Best, TrainState

# train settings that do not change the sequence of updates: free to change on resume
FREE_ON_RESUME = {"epochs", "max_steps", "early_stopping_patience", "early_stopping_delta", "eval_every",
                  "save_every", "save_at_epoch_end", "keep_last", "keep_best",
                  "log_every", "metric_for_best", "nan_policy", "max_nan_in_a_row", "num_workers", "allow_slow_bf16",
                  "collective_timeout_s", "detect_anomaly", "max_minutes",  # a budget's steps are kept on resume
                  "init_from",  # a resume's weights come from its checkpoint
                  "report_to", "experiment",  # trackers watch the run; a resume may add or drop one
                  "label_audit"}  # reads the logits only; turned on at a resume, audit.LabelAudit.load refuses it


@dataclass
class Setup:
    """What is built once, before the first step; what changes as the run goes is a state_io.TrainState."""

    cfg: Config
    acc: Any
    model: Any
    optimizer: Any
    scheduler: Any
    tok: Any
    train_ds: Any
    val_ds: Any
    lengths: Any  # numpy int array: tokens per train row
    collate: Any  # the task's collator
    columns: tuple  # what the loader reads of a row: input_ids and the task's columns
    task: Any  # pipeline.task.Task: builds the model, collates, scores validation
    data_info: dict  # what the task recorded about the prepared data (prepared.json)
    run_dir: Path
    total_steps: int  # the plan; train.max_minutes fixes it after measuring (budget.py)
    steps_per_epoch: int
    precision: build.Precision  # accelerate's mixed_precision (.run), and why
    eval_precision: tuple[str, str]  # what validation runs in, and why (backends.resolve)
    log: rundir.MetricsLog
    config_path: str
    budget: dict | None = None  # train.max_minutes: what was measured and decided (budget.py)
    base: dict | None = None  # peft.method=lora: the base model adapted (lora.base_identity)
    run_id: str | None = None  # the main process's: run_info.json's, written into each checkpoint's manifest
    loss_weights: Any = None  # train.class_weights as a tensor of one weight per class, or None (equal)
    loss_fn: Any = None  # the task's own training loss (Task.training_loss), or None: the model's
    forward: Any = None  # what training and validation call: the model, or under train.compile its compiled forward
    audit: Any = None  # train.label_audit: this process's audit.LabelAudit record, or None

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def loss(self, batch: dict, seen: tuple[int, int] | None = None):
        """A micro-batch's mean loss, as the loop and the time-budget probe take it: the task's own
        (Task.training_loss: causal_lm's fused output layer and cross-entropy, smoothing included), else the model's
        own, or with train.label_smoothing or train.class_weights the task's weighted loss of the model's logits
        (Task.weighted_loss). Through `forward`: the compiled model under train.compile. `seen`: the micro-batch's
        (epoch, index in it), where train.label_audit records its logits (its rows are a function of the two)."""
        t = self.cfg.train
        if self.loss_fn is not None:
            return self.loss_fn(self.forward, batch, t.label_smoothing)
        plain = not (t.label_smoothing or self.loss_weights is not None)
        out = self.forward(**(batch if plain else {k: v for k, v in batch.items() if k != "labels"}))
        if self.audit is not None and seen is not None:
            self.audit.see(out.logits, batch["labels"], *seen)
        if plain:
            return out.loss
        return self.task.weighted_loss(out.logits, batch["labels"], self.loss_weights, t.label_smoothing)


def _fingerprints(cfg: Config, data_fp: str, mp: str) -> dict:
    train = {k: v for k, v in asdict(cfg.train).items() if k not in FREE_ON_RESUME}
    train["mixed_precision"] = mp
    fps = {"model": artifacts.fingerprint(asdict(cfg.model)), "data": data_fp, "train": train}
    if cfg.peft.method != "none":  # merge_final shapes the export only: free on resume
        fps["peft"] = artifacts.fingerprint({k: v for k, v in asdict(cfg.peft).items() if k != "merge_final"})
    return fps


_TRAIN_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def check_resumable(state: TrainState, fps: dict, world: int, path: Path, model_name: str = "") -> None:
    """A checkpoint from another model, data or batching is an error, never garbage. The number of
    processes may change (elastic resume) while train.batch_size x processes stays the same: then the
    global batch and the data order of every epoch (a function of the seed and that product) are too."""
    old = state.fingerprints
    if old.get("base") and old.get("model") != fps.get("model"):  # a LoRA checkpoint: name the base it adapts
        raise ValueError(f"{path} adapts base model {lora.describe_base(old['base'])}, the config's is "
                         f"{model_name or '?'} (other [model] settings: fingerprint {old.get('model')} != "
                         f"{fps.get('model')}); resume with the base and settings it was trained with, or start a "
                         f"new output_dir")
    for key, what in (("model", "[model] settings"), ("data", "prepared data"), ("peft", "[peft] settings")):
        if old.get(key) != fps.get(key):  # peft: absent for peft.method=none, before and after
            raise ValueError(f"{path} was trained with other {what} (fingerprint {old.get(key)} != {fps.get(key)}); "
                             f"resume with the config it was made with, or start a new output_dir")
    old_train, new_train = old.get("train", {}), fps["train"]
    _check_global_batch(old_train, state.num_processes, new_train, world, path)
    # a key the checkpoint's version did not have yet held its default then (a new setting never blocks a resume)
    was = {k: old_train.get(k, _TRAIN_DEFAULTS.get(k)) for k in new_train}
    changed = sorted(k for k in new_train if k != "batch_size" and was[k] != new_train[k])
    if changed:
        diffs = ", ".join(f"train.{k}: {was[k]!r} -> {new_train[k]!r}" for k in changed)
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


def _resolve_resume(run_dir: Path, resume: str | None, config_path: str) -> tuple[Path | None, list]:
    """The checkpoint to resume, and what to say about the search on the main process (once it is known)."""
    root = run_dir / "checkpoints"
    if resume is None:
        return None, []
    if resume != "auto":
        return _checked_resume_path(Path(resume), run_dir), []
    path, warnings = checkpoint.find_resume(root)
    if path is not None and not rundir.belongs(run_dir, path):
        raise FileExistsError(f"--resume auto: the newest checkpoint {path} was made by another run ({_whose(path)}) "
                              f"than the one in {run_dir} (run {rundir.run_id(run_dir)}); move it out of {root}, or "
                              f"continue that run in its own output_dir")
    notes = [partial(checkpoint.warn, w) for w in warnings]
    if path is None:
        rundir.check_fresh_start(run_dir, config_path)
        notes.append(partial(print, f"--resume auto: no complete checkpoint in {root}; starting fresh", flush=True))
    return path, notes


def _whose(path: Path) -> str:
    made = rundir.made_by(path)
    return f"run {made}" if made else str(checkpoint.run_of(path.resolve()))


def _checked_resume_path(path: Path, run_dir: Path) -> Path:
    """`--resume PATH`: a complete checkpoint, and one of this run unless this run has made nothing yet
    (resuming another run's checkpoint here would replace this run's checkpoints, final/ and metrics)."""
    root = run_dir / "checkpoints"
    if not path.exists():
        raise FileNotFoundError(f"--resume {path}: not found; give a checkpoint folder (under {root}) or --resume auto")
    if checkpoint.is_final(path):
        raise ValueError(f"--resume {path}: a final model export holds no optimizer or data position to resume; give a "
                         f"checkpoint under {root}, or fine-tune from it with model.name_or_path={path}")
    reason = checkpoint.verify(path, deep=True)
    if reason:
        raise ValueError(f"--resume {path}: {reason}")
    if not rundir.belongs(run_dir, path) and rundir.holds_run(run_dir):
        raise FileExistsError(f"--resume {path}: that checkpoint is another run's ({_whose(path)}); "
                              f"resuming it here would replace this run's files in {run_dir}; set output_dir to a new "
                              f"folder to continue it there, or move this run's files away first")
    return path


def _load_data(cfg: Config, config_path: str):
    from pipeline.data.prepared import load_prepared, prepare_command

    task = tasks.get(cfg.task)
    prep = load_prepared(cfg, task, config_path)
    for split in ("train", "validation"):
        needed = {"input_ids", "length", *task.columns}
        missing = needed - set(prep.splits[split].column_names) if split in prep.splits else {"split"}
        if missing:
            raise ValueError(f"prepared data in {cfg.data_dir} lacks {split} {sorted(missing)}; "
                             f"rerun `{prepare_command(cfg, task, config_path)}`")
    if len(prep.splits["validation"]) == 0:  # validation picks the best checkpoint and reports progress
        raise ValueError(f"the prepared validation split in {cfg.data_dir} is empty (split.validation="
                         f"{cfg.split.validation}); training evaluates on it: set split.validation above 0 and rerun "
                         f"prepare")
    return prep


def prepare_run(cfg: Config, config_path: str, resume: str | None,
                restart: bool = False) -> tuple[Setup, TrainState] | None:
    """Check, build and (when resuming) restore. None: resumed after the last step, nothing to do."""
    import accelerate.utils  # noqa: F401 - like torch, imported before the train.max_minutes clock starts
    import torch  # noqa: F401

    started = time.perf_counter()  # train.max_minutes counts from here
    trackers.check_installed(cfg.train.report_to)
    build.check_optimizer(cfg.train)
    if not restart:
        rundir.check_run_dir(cfg.run_dir, resume, config_path, main=os.environ.get("RANK", "0") == "0")
    ckpt, notes = (None, []) if restart else _resolve_resume(cfg.run_dir, resume, config_path)
    saved = TrainState.read(ckpt / checkpoint.STATE) if ckpt else None
    # before the accelerator is built: its precision is fixed then, and a resumed auto run keeps its first choice
    precision = build.choose_precision(cfg.train, accel.device_type(),
                                       saved.fingerprints.get("train", {}).get("mixed_precision") if saved else None)
    prep = _load_data(cfg, config_path)
    tok = build.load_tokenizer(prep.tokenizer_dir, cfg.model.from_scratch)
    acc = _accelerator(cfg, precision.run)
    if acc.is_main_process:
        for note in notes:
            note()
    spe = _steps_per_epoch(cfg.train, acc, len(prep.splits["train"]))
    fps = _fingerprints(cfg, prep.fingerprint, precision.kept)
    saved = _check_saved(saved, ckpt, fps, acc.num_processes, prep, cfg.model.name_or_path)
    # a budget's step count (and so warmup and cosine) is fixed at the first launch and kept on every resume,
    # with or without train.max_minutes on the resuming command line
    fixed = rundir.first_budget(checkpoint.run_of(ckpt)) if saved else None
    budgeted = saved is not None and bool(cfg.train.max_minutes or fixed)
    total = saved.total_steps if budgeted else (cfg.train.max_steps or cfg.train.epochs * spe)
    s = _build(cfg, config_path, prep, tok, acc, precision, total, spe, saved)
    if s.base is not None:
        fps["base"] = s.base
    if cfg.train.max_minutes or budgeted:
        s.budget = budget.fix_total_steps(s, started) if saved is None else budget.kept(s, ckpt, fixed)
    st = _start_state(s, ckpt, saved, fps)
    if saved and saved.step >= s.total_steps:
        return _nothing_to_do(s, ckpt, saved)
    _announce(s, st, ckpt)
    return s, st


def _accelerator(cfg: Config, mp: str):
    from accelerate.utils import InitProcessGroupKwargs

    from pipeline.accel import make_accelerator

    t = cfg.train
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=t.collective_timeout_s))  # gloo's default: 30 min
    return make_accelerator(mixed_precision=mp, gradient_accumulation_steps=t.grad_accum,
                            project_dir=str(cfg.run_dir), kwargs_handlers=[timeout])


def _steps_per_epoch(t, acc, rows: int) -> int:
    spe = batching.steps_per_epoch(rows, t.batch_size, acc.num_processes, t.grad_accum)
    if spe == 0:
        per_step = t.batch_size * acc.num_processes * t.grad_accum
        raise ValueError(f"train.batch_size={t.batch_size} x {acc.num_processes} processes x train.grad_accum="
                         f"{t.grad_accum} = {per_step} examples per step, but the train split has {rows} "
                         f"rows: zero steps per epoch; lower train.batch_size or train.grad_accum")
    return spe


def _check_saved(saved: TrainState | None, ckpt: Path | None, fps: dict, world: int, prep,
                 model_name: str) -> TrainState | None:
    """The checkpoint's state.json (read strictly typed), checked to continue this run (before anything is built).
    Its data is this run's when the content is the same, whichever code prepared it (prepared.is_same_data)."""
    if saved is None:
        return None
    from pipeline.data.prepared import is_same_data

    if is_same_data(saved.fingerprints.get("data"), prep):
        saved.fingerprints = {**saved.fingerprints, "data": prep.fingerprint}
    check_resumable(saved, fps, world, ckpt, model_name)
    return saved


def _build(cfg: Config, config_path: str, prep, tok, acc, precision: build.Precision, total: int, spe: int,
           saved: TrainState | None) -> Setup:
    """Seed, then the model, optimizer and schedule, prepared by accelerate (the scheduler stays ours)."""
    import numpy as np
    from accelerate.utils import set_seed

    t, run_dir, train_ds = cfg.train, cfg.run_dir, prep.splits["train"]
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_seed(t.seed, deterministic=t.deterministic)
    task = tasks.get(cfg.task)
    model = task.build_model(cfg, tok, prep.info)
    if t.init_from and saved is None:  # a resume's weights come from its checkpoint
        build.warm_start(model, t.init_from)
    from pipeline.data.prepared import longest_example

    build.check_fit(model, tok, train_ds, longest_example(prep, cfg, task),
                    f"model {cfg.model.name_or_path or cfg.model.from_scratch}", task.max_tokens_setting)
    if task.check_settings is not None:
        task.check_settings(model, tok, cfg)
    weights = class_weights(t, task, train_ds, prep.info)  # before any file: a wrong class name is one line
    if t.gradient_checkpointing:  # non-reentrant: works under DDP (no "marked ready twice"), and with LoRA's
        # frozen embeddings (the reentrant variant needs inputs that require grad: peft's enable_input_require_grads)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    attention = build.training_attention(t.attention, precision.run, acc.device.type, task.cpu_bf16_attention)
    if attention:
        model.set_attn_implementation(attention)
    model, base = lora.adapt(cfg, task, model, acc)
    loss_fn = task.training_loss(model) if task.training_loss is not None else None
    compile_it = build.can_compile(t.compile, acc.device.type)  # inductor fuses torch's own dropout
    if acc.device.type == "cpu" and not compile_it:  # the same masks in distribution, ~5x faster than bernoulli_
        from pipeline.training import dropout

        dropout.use_cpu_dropout(model)
    optimizer, scheduler = build.build_optimizer(model, t, total)
    model, optimizer = acc.prepare(model, optimizer)  # the scheduler is stepped once per optimizer step, by us
    forward = build.compiled(model) if compile_it else model
    if saved is None:
        _set_aside_earlier_attempt(acc, run_dir)
    acc.wait_for_everyone()
    collate = task.collator(tok.pad_token_id, padding.pad_multiple(acc.device.type, t.pad_to_multiple_of),
                            cfg.tokenize.max_length)
    log = rundir.MetricsLog(run_dir / "metrics.jsonl", acc.is_main_process, saved.step if saved else None)
    return Setup(cfg=cfg, acc=acc, model=model, optimizer=optimizer, scheduler=scheduler, tok=tok, train_ds=train_ds,
                 val_ds=prep.splits["validation"], lengths=np.asarray(train_ds["length"][:], dtype=np.int64),
                 collate=collate, columns=("input_ids", *task.columns, *pair_columns(train_ds)), task=task, data_info=prep.info, run_dir=run_dir, total_steps=total,
                 steps_per_epoch=spe, precision=precision, log=log, config_path=config_path, base=base,
                 eval_precision=backends.resolve(cfg.eval, acc.device.type, precision.run),
                 loss_weights=None if weights is None else weights.to(acc.device), loss_fn=loss_fn,
                 forward=forward, audit=audit.for_run(cfg.train, task, train_ds, prep.info, acc))


def class_weights(t, task, train_ds, info: dict):
    """train.class_weights as one float32 weight per class (the data's label order), or None: `balanced` is
    sklearn's n / (classes x count) from the train rows (Task.class_counts), name:weight items give theirs and
    the rest weigh 1. A name that is not a class, a malformed item or a class with no train row to balance is
    one line."""
    if not t.class_weights:
        return None
    import torch

    names = list(info.get("label_names") or [])
    if t.class_weights == ["balanced"]:
        counts = task.class_counts(train_ds["label"][:], names)
        empty = [n for n, c in zip(names, counts) if not c]
        if empty:
            raise ValueError(f"train.class_weights=balanced: class {empty[0]!r} has no train rows to weigh by; give "
                             f"the weights by name (name:weight)")
        total = sum(counts)
        return torch.tensor([total / (len(names) * c) for c in counts], dtype=torch.float32)
    weights = [1.0] * len(names)
    for item in t.class_weights:
        name, sep, value = str(item).rpartition(":")
        try:
            weight = float(value) if sep else float("nan")
        except ValueError:
            weight = float("nan")
        if not (weight >= 0 and weight != float("inf")):
            raise ValueError(f"train.class_weights: {item!r} is not name:weight with a weight >= 0, nor balanced")
        if name not in names:
            raise ValueError(f"train.class_weights: {name!r} is not a class of the prepared data; classes: "
                             f"{', '.join(names)}")
        weights[names.index(name)] = weight
    return torch.tensor(weights, dtype=torch.float32)


def pair_columns(ds) -> tuple[str, ...]:
    """What the loader reads of sentence pairs besides the task's columns: token_type_ids, where the tokenizer gave them."""
    return ("token_type_ids",) if "token_type_ids" in ds.column_names else ()


def _set_aside_earlier_attempt(acc, run_dir: Path) -> None:
    if acc.is_main_process and rundir.holds_run(run_dir):
        moved = rundir.set_aside(run_dir)
        if moved:
            print(f"the earlier attempt's files were moved to {moved} (nothing was deleted)", flush=True)


def _start_state(s: Setup, ckpt: Path | None, saved: TrainState | None, fps: dict) -> TrainState:
    """A fresh state, or the checkpoint's with its weights, optimizer, scheduler and RNG loaded."""
    metric = s.cfg.train.metric_for_best
    if saved is None:
        return TrainState.fresh(metric, s.task.metrics[metric], s.total_steps, s.acc.num_processes, fps)
    if saved.total_steps != s.total_steps and s.acc.is_main_process:
        checkpoint.warn(f"total steps changed from {saved.total_steps} to {s.total_steps}: the learning-rate "
                        f"schedule differs from the original run's from here on")
    if saved.fingerprints.get("base") != fps.get("base"):
        raise ValueError(f"{ckpt} adapts base model {lora.describe_base(saved.fingerprints.get('base'))}, the "
                         f"config's is {lora.describe_base(fps.get('base'))}; resume with the base it was "
                         f"trained on, or start a new output_dir")
    checkpoint.load_checkpoint(s.acc, ckpt, s.model, s.optimizer, s.scheduler)  # RNG last: nothing draws after
    if s.audit is not None:
        s.audit.load(ckpt)
    # metric_for_best is free on resume: this run's metric and direction, the saved best value and step
    best = Best.of(metric, s.task.metrics[metric], saved.best.value, saved.best.step)
    return replace(saved, total_steps=s.total_steps, num_processes=s.acc.num_processes, fingerprints=fps, best=best)


def final_config(s: Setup) -> dict:
    """What the task sets on final/'s config.json from the final model's validation outputs (Task.final_config;
    multilabel: tuned thresholds); every process predicts its share (a collective), all get the same dict."""
    if s.task.final_config is None or not s.val_ds.num_rows:
        return {}
    from pipeline.training.validation import outputs

    logits = outputs(s.acc, s.model, s.val_ds, s.cfg.eval.batch_size, s.task, s.eval_precision[0],
                     s.cfg.eval.runtime, s.cfg.run_dir)
    return s.task.final_config(logits, s.val_ds, s.data_info, s.cfg)


def _nothing_to_do(s: Setup, ckpt: Path, saved: TrainState) -> None:
    settings = final_config(s) if not (s.run_dir / "final" / "config.json").is_file() else {}
    if not (s.run_dir / "final" / "config.json").is_file():
        audit.at_end(s, saved)  # a kill after the last checkpoint: the report from its record, before the card
    weights = s.acc.get_state_dict(s.model)  # the full state dict: a collective under FSDP/ZeRO-3
    if s.acc.is_main_process:
        print(f"--resume: {ckpt} is at {saved.describe()}, the end of a {s.total_steps}-step run; "
              f"nothing to do", flush=True)
        if not (s.run_dir / "final" / "config.json").is_file():
            export_final(s, {"step": saved.step, "epoch": saved.epoch, "best": asdict(saved.best),
                             "fingerprints": saved.fingerprints}, weights, settings)
            print(f"exported the final model to {s.run_dir / 'final'}", flush=True)
    s.acc.wait_for_everyone()
    return None


def export_final(s: Setup, state: dict | None, weights: dict, settings: dict | None = None) -> None:
    """final/ from the main process; `weights`: the full state dict (accelerator.get_state_dict, a collective);
    `settings`: attributes set on the exported config.json (Task.final_config).
    An adapted model is exported from a fresh copy of its base with these weights' trained tensors: the same
    under any backend (FSDP shards the training model's), with the base checked to be the one trained on;
    QLoRA's at full precision (the adapters merged into the base's own weights, not its 4-bit copy)."""
    model = s.acc.unwrap_model(s.model)
    if s.base is not None:
        import contextlib
        import io

        import torch

        # building draws the head's and adapters' initial values (not the run's), and says the head is new
        with torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
            full = replace(s.cfg, peft=replace(s.cfg.peft, quantize="none"))
            model, rebuilt = lora.adapt(full, s.task, s.task.build_model(full, s.tok, s.data_info))
        lora.check_base(rebuilt, s.base, s.run_dir / "final")
        lora.load_trained(s.run_dir / "final", model, weights)
        weights = None
    for key, value in (settings or {}).items():
        setattr(model.config, key, value)
    rundir.export_final(model, s.tok, s.run_dir / "final", state, weights, merge=s.cfg.peft.merge_final,
                        run_id=s.run_id or rundir.run_id(s.run_dir))
    card.write(s.cfg)  # final/README.md, which evaluate.py rewrites with its figures


def _announce(s: Setup, st: TrainState, ckpt: Path | None) -> None:
    acc, model = s.acc, s.acc.unwrap_model(s.model)
    if acc.is_main_process:
        s.run_id = rundir.record_launch(s.cfg, s.run_dir, {
            "num_processes": acc.num_processes, "mixed_precision": s.precision.run,
            "mixed_precision_chosen_by": s.precision.why, "eval_precision": s.eval_precision[0],
            "eval_precision_chosen_by": s.eval_precision[1], "attention": backends.attention_of(model),
            "resumed_from": str(ckpt) if ckpt else None, "model": build.describe(model),
            "fingerprints": st.fingerprints, "budget": s.budget,
        })
        if not (s.run_dir / "model_config" / "config.json").is_file():
            rundir.export_model_config(model, s.tok, s.run_dir / "model_config")
        where = f"resuming from {ckpt} at {st.describe()}" if ckpt else "starting fresh"
        if s.precision.run != s.precision.kept:
            checkpoint.warn(f"precision {s.precision.run}: {s.precision.why}")
        print(f"precision {s.precision.run} ({s.precision.why}); validation {s.eval_precision[0]} "
              f"({s.eval_precision[1]}); attention {backends.attention_of(model)}", flush=True)
        print(f"{build.describe(model)}; {acc.num_processes} process(es), precision {s.precision.run}; "
              f"{s.steps_per_epoch} steps/epoch, {s.total_steps} steps; {where}", flush=True)
    trackers.start(acc, s.cfg, s.run_dir, fresh=ckpt is None)  # after record_launch: a fresh run's folder exists
    acc.wait_for_everyone()
