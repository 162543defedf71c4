"""The training loop: one optimizer step at a time, and the policies it calls after each step.

What is built once comes from setup (Setup); what changes is a state_io.TrainState, exactly what a
checkpoint's state.json holds. Its position (step, epoch, micro-batch within the epoch) is the only
thing that says where the run is; the data order of an epoch is a pure function of the seed and the
epoch (batching.epoch_order), so resuming rebuilds it and starts at the saved micro-batch directly.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field

from pipeline import artifacts
from pipeline.config import Config
from pipeline.training import audit, batching, checkpoint, memory, signals, trackers
from pipeline.training.setup import Setup, export_final, final_config, prepare_run
from pipeline.training.state_io import TrainState


@dataclass
class Window:
    """Sums over the optimizer steps since the last log record (this process)."""

    loss: float = 0.0
    steps: int = 0
    tokens: int = 0  # real (non-pad) tokens
    slots: int = 0  # tokens including padding
    samples: int = 0
    lr: float = 0.0  # of the window's last step
    grad_norm: float = 0.0  # of the window's last step
    start: float = field(default_factory=time.perf_counter)
    paused: float = 0.0  # seconds spent evaluating and saving: not training throughput

    def training_seconds(self) -> float:
        return max(time.perf_counter() - self.start - self.paused, 1e-9)

    def count(self, batch: dict) -> None:
        mask = batch.get("attention_mask")  # none for packed blocks (causal_lm): every slot but a split's last is a token
        self.tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        self.slots += batch["input_ids"].numel() if mask is None else mask.numel()
        self.samples += len(batch["labels"])


def train(cfg: Config, config_path: str = "<config>", resume: str | None = None, restart: bool = False) -> int:
    """Train (or resume) as the config says; returns the process exit code (see signals.EXIT_CODES)."""
    run = prepare_run(cfg, config_path, resume, restart)
    if run is None:
        return signals.EXIT_OK
    s, st = run
    stop = signals.StopFlag()
    try:
        code = _run(s, st, stop)
    except RuntimeError as e:
        if not (cfg.train.detect_anomaly and "returned nan" in str(e).lower()):
            raise
        checkpoint.warn(f"anomaly detection (train.detect_anomaly) at step {st.step + 1}: {e}")  # every rank's own
        code = signals.EXIT_NONFINITE
    finally:
        s.acc.end_training()  # flushes TensorBoard; a stop's second SIGTERM is ignored until restore
        stop.restore()
    return code


def _run(s: Setup, st: TrainState, stop: signals.StopFlag) -> int:
    import torch
    from tqdm.auto import tqdm

    t, acc = s.cfg.train, s.acc
    per_epoch = s.steps_per_epoch * t.grad_accum  # micro-batches per rank per epoch
    bar = tqdm(total=s.total_steps, initial=st.step, disable=not acc.is_main_process, desc="train", mininterval=1)
    win, loss_acc, code = Window(), torch.zeros((), device=acc.device), None
    # raises in the backward of the first operation whose gradient is NaN, naming it (RuntimeError in train)
    anomaly_mode = torch.autograd.detect_anomaly(check_nan=True) if t.detect_anomaly else contextlib.nullcontext()
    if st.step == 0 and s.task.samples is not None and acc.is_main_process:  # the model before training: a baseline
        _write_samples(s, 0, s.task.samples(acc.unwrap_model(s.model), s.tok, s.cfg, 0))
    if t.release_memory_every:  # freed pages kept for the next step between releases (pipeline/training/memory.py)
        memory.hold_freed_memory()
    s.model.train()
    while code is None and st.step < s.total_steps and not _stopped_early(s, st):
        for batch, weight in _weighted(s, _epoch_batches(s, st)):
            with acc.accumulate(s.model), anomaly_mode:
                loss = s.loss(batch, (st.epoch, st.batch_in_epoch))  # mean over this micro-batch
                if weight is not None:  # its share of the step's targets on every process (see _weighted)
                    loss = loss * weight
                acc.backward(loss)
            loss_acc += loss.detach() / t.grad_accum
            win.count(batch)
            st.batch_in_epoch += 1
            if not acc.sync_gradients:
                continue
            stopping, code = _optimizer_step(s, st, loss_acc, win, stop)
            loss_acc = torch.zeros((), device=acc.device)
            epoch_end = st.batch_in_epoch == per_epoch
            if epoch_end:
                st.epoch, st.batch_in_epoch = st.epoch + 1, 0
            bar.update(1)
            code = code or _after_step(s, st, win, epoch_end, stop, stopping)
            if code is not None or st.step >= s.total_steps or _stopped_early(s, st):
                break
    bar.close()
    return _finish(s, st) if code is None else code


def _weighted(s: Setup, batches):
    """(micro-batch, weight): weight None for a task whose micro-batches weigh the same; else, with the task's
    count n_i of what micro-batch i's mean loss is over (causal_lm: target tokens) and N the count of the
    whole step (its grad_accum micro-batches on every process, one all-reduce), weight = n_i * P * A / N:
    accelerate divides each loss by A (grad_accum) and DDP averages over P processes, so the step's gradient
    is that of the mean over all N targets, whatever the micro-batches' sizes."""
    count = s.task.loss_tokens
    if count is None:
        yield from ((b, None) for b in batches)
        return
    step_of = s.cfg.train.grad_accum
    group: list = []
    for batch in batches:
        group.append(batch)
        if len(group) == step_of:
            yield from _scaled(s, group, count)
            group = []
    if group:  # an epoch ends on a whole step (steps_per_epoch); kept for safety
        yield from _scaled(s, group, count)


def _scaled(s: Setup, group: list, count):
    import torch

    counts = [count(b).to(torch.float64) for b in group]
    total = s.acc.reduce(torch.stack(counts).sum(), reduction="sum")
    factor = s.acc.num_processes * s.cfg.train.grad_accum / total.clamp(min=1)
    for batch, n in zip(group, counts):
        yield batch, (n * factor).float()


def _epoch_batches(s: Setup, st: TrainState):
    """This rank's micro-batches of the current epoch from the state's position on, on the device."""
    t, acc = s.cfg.train, s.acc
    order = batching.epoch_order(s.lengths, t.seed, st.epoch, t.batch_size * acc.num_processes, t.group_by_length)
    sampler = batching.RankBatches(order, acc.process_index, t.batch_size, st.batch_in_epoch,
                                   s.steps_per_epoch * t.grad_accum)
    gpu = acc.device.type == "cuda"
    for batch in batching.make_loader(s.train_ds, sampler, s.collate, t.num_workers, pin_memory=gpu, columns=s.columns):
        yield {k: v.to(acc.device, non_blocking=gpu) for k, v in batch.items()}  # pinned: async copy


def _optimizer_step(s: Setup, st: TrainState, loss_acc, win: Window, stop) -> tuple[bool, int | None]:
    """Clip, check for non-finite values and a stop request (all ranks agree), step or skip.
    Returns (stop agreed, an exit code to halt or None)."""
    t, acc = s.cfg.train, s.acc
    norm = acc.clip_grad_norm_(s.model.parameters(), t.max_grad_norm if t.max_grad_norm > 0 else math.inf)
    loss, norm = float(loss_acc), float(norm)
    # with fp16 the gradient scaler owns overflowing gradients (it skips and lowers its scale)
    bad_local = not math.isfinite(loss) or (acc.scaler is None and not math.isfinite(norm))
    stopping, bad = signals.agree(acc, stop.requested, bad_local)
    win.lr = s.scheduler.get_last_lr()[0]
    if bad:
        st.nan.skipped_total += 1
        st.nan.in_a_row += 1
    else:
        s.optimizer.step()
        st.nan.in_a_row = 0
    s.scheduler.step()  # the rate is a function of the step, skipped or not
    s.optimizer.zero_grad(set_to_none=True)
    st.step, st.metrics = st.step + 1, {}  # a new step: not evaluated yet
    win.loss, win.steps, win.grad_norm = win.loss + loss, win.steps + 1, norm
    return stopping, (_nonfinite(s, st, loss, norm) if bad else None)


def _nonfinite(s: Setup, st: TrainState, loss: float, norm: float) -> int | None:
    t, nan = s.cfg.train, st.nan
    msg = f"step {st.step}: non-finite loss {loss} or gradient norm {norm}"
    s.log.write({"step": st.step, "event": "nonfinite", "loss": str(loss), "grad_norm": str(norm),
                 "skipped_total": nan.skipped_total, "in_a_row": nan.in_a_row})
    if t.nan_policy == "halt" or nan.in_a_row >= t.max_nan_in_a_row:
        why = "nan_policy=halt" if t.nan_policy == "halt" else f"{nan.in_a_row} in a row (train.max_nan_in_a_row)"
        if s.acc.is_main_process:
            checkpoint.warn(f"{msg}; halting ({why}). {_replay_hint(s)}")
        return signals.EXIT_NONFINITE
    if s.acc.is_main_process:
        checkpoint.warn(f"{msg}; update skipped ({nan.in_a_row} in a row, {nan.skipped_total} in total)")
    return None


def _replay_hint(s: Setup) -> str:
    """Where the last healthy state is, and the command that replays the failing steps from it with
    autograd's anomaly detection, which names the operation that produced the first NaN/inf."""
    healthy = checkpoint.last_healthy(checkpoint.complete_checkpoints(s.ckpt_root))
    start = f"--resume {healthy}" if healthy else "--restart"
    where = f"last healthy checkpoint: {healthy}" if healthy else "no healthy checkpoint saved yet"
    return (f"{where}. To find the operation that produced it, replay with anomaly detection (slow, for debugging): "
            f"python pipeline/train.py --config {s.config_path} {start} train.detect_anomaly=true")


def _after_step(s: Setup, st: TrainState, win: Window, epoch_end: bool, stop, stopping: bool) -> int | None:
    """Log, evaluate, checkpoint, and honour a stop request, in that order."""
    t, step = s.cfg.train, st.step
    last = step >= s.total_steps
    if step % t.log_every == 0 or last:
        _log_train(s, st, win)
        win.__init__()  # the next record covers the steps after this one
    if t.release_memory_every and step % t.release_memory_every == 0:
        memory.release_free_heap()  # the heap's holes left by varying batch shapes go back (counted as training)
    paused = time.perf_counter()
    evaluated = bool((t.eval_every and step % t.eval_every == 0) or last)
    if evaluated:
        _evaluate(s, st)
    want_save = (t.save_every and step % t.save_every == 0) or (epoch_end and t.save_at_epoch_end)
    # early stopping ends with the best checkpoint's model: each new best is saved, and so is the step it stops at
    # (a kill before the export then resumes straight to it)
    early = t.early_stopping_patience and evaluated and (st.best.step == step or _stopped_early(s, st))
    if want_save or last or stopping or early:
        _save(s, st)
    win.paused += time.perf_counter() - paused
    if stopping:
        stop.saved()
        if s.acc.is_main_process:
            checkpoint.warn(f"stopped at step {step} by {stop.signal_name or 'a signal on another process'}; "
                            f"checkpoint saved. Continue with --resume auto (exit code {signals.EXIT_INTERRUPTED})")
        return signals.EXIT_INTERRUPTED
    return None


def _log_train(s: Setup, st: TrainState, win: Window) -> None:
    """One record for the window: mean loss over its steps and ranks, throughput of all ranks, and
    with several processes each rank's own mean loss (a diverging rank shows up next to the others)."""
    import torch

    acc = s.acc
    mine = torch.tensor([win.loss, win.steps, win.tokens, win.slots, win.samples, win.training_seconds()],
                        dtype=torch.float64, device=acc.device)
    ranks = acc.gather(mine[None]).cpu() if acc.num_processes > 1 else mine[None]  # (processes, 6)
    loss, steps, tokens, slots, samples, _ = ranks.sum(0).tolist()
    elapsed = ranks[:, 5].max().item()  # the ranks run in lockstep: the slowest one's time
    record = {
        "step": st.step, "epoch": st.epoch, "loss": loss / max(steps, 1), "lr": win.lr,
        "grad_norm": win.grad_norm, "tokens_per_s": tokens / elapsed, "samples_per_s": samples / elapsed,
        "padding_fraction": 1 - tokens / max(slots, 1), "tokens": int(tokens), "steps": int(steps / len(ranks)),
        "seconds": elapsed, "nonfinite_skipped": st.nan.skipped_total,
    }
    rank_losses = (ranks[:, 0] / ranks[:, 1].clamp(min=1)).tolist()
    if len(rank_losses) > 1:
        record.update({f"loss_rank_{r}": v for r, v in enumerate(rank_losses)})
        _warn_diverging(s, st.step, rank_losses)
    s.log.write(record)
    acc.log({f"train/{k}": v for k, v in record.items() if k not in ("step", "epoch", "tokens", "steps", "seconds")},
            step=st.step)


def _warn_diverging(s: Setup, step: int, rank_losses: list[float]) -> None:
    """A rank whose window loss is non-finite, or above twice the median rank's plus 0.5, is named: the
    ranks see different rows, so their losses differ, but not by that much unless one has gone wrong."""
    median = sorted(rank_losses)[(len(rank_losses) - 1) // 2]
    odd = [r for r, v in enumerate(rank_losses) if not math.isfinite(v) or v > 2 * median + 0.5]
    if odd and s.acc.is_main_process:
        checkpoint.warn(f"step {step}: the loss of rank(s) {odd} ({', '.join(f'{rank_losses[r]:.4g}' for r in odd)}) "
                        f"leaves the other ranks' (median {median:.4g}); look at that rank's data or hardware")


def _evaluate(s: Setup, st: TrainState) -> None:
    """Validation with evaluate.py's code (batches and eval.precision too): this step's metrics, the best so far."""
    from pipeline.training.validation import validate

    plain = s.eval_precision[0] == "int8" or s.cfg.eval.runtime != "torch"  # a quantized copy, an ONNX export
    m = validate(s.acc, s.model if plain else s.forward, s.val_ds, s.cfg.eval.batch_size, s.task, s.data_info,
                 s.eval_precision[0], s.cfg.eval.runtime, s.cfg.run_dir)
    st.metrics = m
    st.best.offer(m[st.best.metric], st.step)
    if s.cfg.train.early_stopping_patience:
        st.patience.offer(m[st.best.metric], st.best.greater_is_better, s.cfg.train.early_stopping_delta)
    s.log.write({"step": st.step, "eval": m})
    s.acc.log({f"eval/{k}": v for k, v in m.items() if k != "examples"}, step=st.step)
    if s.task.samples is not None and s.acc.is_main_process:
        _write_samples(s, st.step, s.task.samples(s.acc.unwrap_model(s.model), s.tok, s.cfg, st.step))


def _write_samples(s: Setup, step: int, samples: list[dict]) -> None:
    """run/samples/step-N.jsonl (a step redone after a resume writes the same file again) and TensorBoard text."""
    if not samples:
        return
    artifacts.write_jsonl_atomic(s.cfg.run_dir / "samples" / f"step-{step:07d}.jsonl", samples)
    writer = s.acc.get_tracker("tensorboard", unwrap=True) if "tensorboard" in s.cfg.train.report_to else None
    if hasattr(writer, "add_text"):
        for k, x in enumerate(samples):
            writer.add_text(f"samples/{k}", "    " + x["text"].replace("\n", "\n    "), step)  # markdown: verbatim


def _save(s: Setup, st: TrainState) -> None:
    """A checkpoint of this step (its state.json: st.to_json()), then rotation."""
    name = f"step-{st.step:07d}"
    checkpoint.save_checkpoint(s.acc, s.ckpt_root, name, s.model, s.optimizer, s.scheduler, st.to_json(), s.run_id,
                               extra=audit.checkpoint_writer(s))  # train.label_audit's record, all ranks summed
    if s.acc.is_main_process:
        checkpoint.rotate(s.ckpt_root, s.cfg.train.keep_last, s.cfg.train.keep_best)
    trackers.flush(s.acc)
    s.acc.wait_for_everyone()


def _stopped_early(s: Setup, st: TrainState) -> bool:
    patience = s.cfg.train.early_stopping_patience
    return bool(patience) and st.patience.stale >= patience


def _restore_best(s: Setup, st: TrainState) -> dict:
    """Early stopping: the best checkpoint loaded (its weights under any backend, as a resume loads them), the
    stop said on the console, in metrics.jsonl and to the trackers; returns what final/state.json records of it."""
    t, best = s.cfg.train, st.best
    path = s.ckpt_root / f"step-{best.step:07d}"
    saved = checkpoint.load_checkpoint(s.acc, path, s.model, s.optimizer, s.scheduler)
    record = {"stopped_at": st.step, "best_step": best.step, "patience": t.early_stopping_patience,
              "delta": t.early_stopping_delta, "metric": best.metric, "best_value": best.value}
    if s.acc.is_main_process:
        s.log.write({"step": st.step, "event": "early_stopped", **record})
        s.acc.log({"early_stopping/stopped_at": st.step, "early_stopping/best_step": best.step}, step=st.step)
        print(f"early stopping at step {st.step}: {best.metric} did not improve on {best.value:.4g} by more than "
              f"{t.early_stopping_delta:g} in {t.early_stopping_patience} validation(s) in a row; final/ is step "
              f"{best.step}'s model ({path})", flush=True)
    return {"step": saved["step"], "epoch": saved["epoch"], "early_stopped": record}


def _finish(s: Setup, st: TrainState) -> int:
    """After the last step: the final export (a checkpoint of the last step exists already); after an early stop,
    the best checkpoint's model."""
    audit.at_end(s, st)  # train.label_audit: run/label_audit.jsonl, before the card that counts it
    at = _restore_best(s, st) if _stopped_early(s, st) else {"step": st.step, "epoch": st.epoch}
    settings = final_config(s)
    weights = s.acc.get_state_dict(s.model)  # the full state dict: a collective under FSDP/ZeRO-3
    if s.acc.is_main_process:
        best = asdict(st.best)
        state = {**at, "best": best, "fingerprints": st.fingerprints}
        export_final(s, state, weights, settings)
        if settings:
            s.log.write({"step": st.step, "event": "final_config", **settings})
        s.log.write({"step": st.step, "event": "finished", "best": best, "final": str(s.run_dir / "final")})
        s.acc.log({f"best/{st.best.metric}": st.best.value, "best/step": st.best.step}, step=st.step)
        print(f"finished at step {st.step}; final model: {s.run_dir / 'final'}; best {best}", flush=True)
    s.acc.wait_for_everyone()
    return signals.EXIT_OK
