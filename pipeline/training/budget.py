"""train.max_minutes: the run's total steps chosen so that it fits a wall-clock budget.

At a fresh launch, once the model and optimizer are built, `fix_total_steps` times what the run is
made of, on this machine and this data:
  - an optimizer step: PROBE_STEPS real steps (forward, backward, clipping, AdamW) on micro-batches
    spread over epoch 0's order (lengths vary along it), after one untimed warm-up step. Weights,
    optimizer state and every RNG are restored afterwards, so the run that follows is exactly the
    run `train.max_steps=N` would be (a test compares them);
  - a validation: `evaluate` (eval.precision included) on a length-stratified sample of the
    validation split, scaled to its size; the per-call cost (int8 quantizes a copy; eval.runtime=onnxruntime
    puts the weights into the run's exported graph, + int8 quantization) counted once. ONNX Runtime's
    one full export per run (onnx_template) is made before that, so it is part of setup's time;
  - a checkpoint: writing, fsyncing and hashing the weights once, x3 (AdamW's two moments are as
    large as the weights); the final export x1.
`plan_steps` takes the largest N whose cost fits the time left (less MARGIN), at most the steps the
config asks for otherwise (max_steps, else epochs), so the budget never lengthens a run. N sets warmup
and cosine as usual, goes to state.json as total_steps (every checkpoint) and to run_info.json with
the measurements; a resume takes N from its checkpoint and measures nothing. The clock starts when
setup starts (Python, torch and the launcher's start-up, a few seconds, come before it).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.training import batching, build, state_io

PROBE_STEPS = 3  # timed steps; spread over the epoch, their mean stands for the epoch's mix of lengths
MARGIN = 0.05  # of the budget kept back: step times on a shared machine drift by a few percent
SAMPLE_BATCHES = 4  # validation batches sampled to time a validation


@dataclass
class Costs:
    """Seconds, measured (the slowest process's where there are several)."""

    step: float  # one optimizer step
    validation: float  # one validation over the whole split
    checkpoint: float  # one checkpoint
    export: float  # the final export


def events(n: int, every: int, extra_every: int = 0) -> int:
    """Steps in 1..n at which something happens every `every` (and every `extra_every`) steps, plus step n."""
    def multiples(k: int) -> int:
        return n // k if k else 0

    both = multiples(every * extra_every // math.gcd(every, extra_every)) if every and extra_every else 0
    count = multiples(every) + multiples(extra_every) - both
    on_last = (every and n % every == 0) or (extra_every and n % extra_every == 0)
    return count + (0 if on_last else 1)


def run_seconds(n: int, c: Costs, t: Any, steps_per_epoch: int) -> float:
    """Wall-clock of steps 1..n: the steps, the validations and checkpoints the config asks for, the export."""
    epoch_saves = steps_per_epoch if t.save_at_epoch_end else 0
    return (n * c.step + events(n, t.eval_every) * c.validation
            + events(n, t.save_every, epoch_saves) * c.checkpoint + c.export)


def plan_steps(left_s: float, c: Costs, t: Any, steps_per_epoch: int, cap: int) -> int:
    """The largest n <= cap whose run_seconds fit in left_s (0 when not even one step does)."""
    lo, hi = 0, cap
    while lo < hi:  # run_seconds grows with n
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if run_seconds(mid, c, t, steps_per_epoch) <= left_s else (lo, mid - 1)
    return lo


def fix_total_steps(s: Any, started: float) -> dict:
    """Measure, plan, and set s.total_steps and s.scheduler; returns the record run_info.json keeps."""
    t = s.cfg.train
    if s.acc.distributed_type.value in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        raise ValueError(f"train.max_minutes is not supported with {s.acc.distributed_type.value} (the probe restores "
                         f"plain weights); set train.max_minutes=0 and train.max_steps")
    costs = measure(s)
    cap = t.max_steps or t.epochs * s.steps_per_epoch
    elapsed = time.perf_counter() - started
    left = t.max_minutes * 60 * (1 - MARGIN) - elapsed
    n = plan_steps(left, costs, t, s.steps_per_epoch, cap)
    if n == 0:
        raise ValueError(f"train.max_minutes={t.max_minutes:g} leaves no time to train: setup took {elapsed:.0f} s, "
                         f"one step {costs.step:.2f} s, a validation {costs.validation:.1f} s, a checkpoint "
                         f"{costs.checkpoint:.1f} s; raise train.max_minutes")
    s.total_steps, s.scheduler = n, build.schedule(s.scheduler.optimizer, t, n)  # no step taken yet
    record = {"max_minutes": t.max_minutes, "total_steps": n, "warmup_steps": math.ceil(t.warmup_ratio * n),
              "capped": n == cap, "cap": cap, "setup_seconds": round(elapsed, 2),
              "measured_seconds": {k: round(v, 4) for k, v in asdict(costs).items()},
              "planned_seconds": round(elapsed + run_seconds(n, costs, t, s.steps_per_epoch), 1)}
    if s.acc.is_main_process:
        print(describe(record, t), flush=True)
    return record


def kept(s: Any, ckpt: Any, first: dict | None = None) -> dict:
    """A resume of a budgeted run: the steps fixed at the first launch (state.json's total_steps) stand,
    whatever train.max_minutes the resuming command gives (`first`: the first launch's record)."""
    minutes = (first or {}).get("max_minutes", s.cfg.train.max_minutes)
    if s.acc.is_main_process:
        print(f"time budget train.max_minutes={minutes:g}: resuming with the {s.total_steps} steps fixed at the first "
              f"launch ({ckpt.name}/state.json); nothing is measured again", flush=True)
    return {"max_minutes": minutes, "total_steps": s.total_steps, "kept_from": str(ckpt)}


def describe(r: dict, t: Any) -> str:
    m = r["measured_seconds"]
    why = (f"capped by {'train.max_steps' if t.max_steps else 'train.epochs'} ({r['cap']} steps)" if r["capped"]
           else f"the most that fit, {MARGIN:.0%} of the budget kept in reserve")
    return (f"time budget train.max_minutes={t.max_minutes:g}: measured one step {m['step']:.3f} s, a validation "
            f"{m['validation']:.1f} s, a checkpoint {m['checkpoint']:.1f} s, the export {m['export']:.1f} s, setup "
            f"{r['setup_seconds']:.0f} s -> {r['total_steps']} steps ({why}; warmup {r['warmup_steps']}, {t.lr_schedule} "
            f"to step {r['total_steps']}), planned to end {r['planned_seconds'] / 60:.1f} min after setup started; "
            f"fixed for this run: a resume keeps {r['total_steps']} steps")


def measure(s: Any) -> Costs:
    """This run's costs on this machine; every process gets the slowest one's (all must choose the same N)."""
    import torch

    acc = s.acc
    step, validation = _step_seconds(s), _validation_seconds(s)
    checkpoint, export = _write_seconds(s) if acc.is_main_process else (0.0, 0.0)  # only the main process writes
    mine = torch.tensor([[step, validation, checkpoint, export]], dtype=torch.float64, device=acc.device)
    worst = (acc.gather(mine) if acc.num_processes > 1 else mine).max(dim=0).values.tolist()
    return Costs(*worst)


def _step_seconds(s: Any) -> float:
    """Mean seconds of PROBE_STEPS optimizer steps as the loop takes them (Setup.loss: the run's loss, compiled or
    not); the run's state is restored."""
    import torch

    t, acc, model, opt = s.cfg.train, s.acc, s.model, s.optimizer
    per_epoch = s.steps_per_epoch * t.grad_accum  # micro-batches per rank
    order = batching.epoch_order(s.lengths, t.seed, 0, t.batch_size * acc.num_processes, t.group_by_length)
    # untimed first: one step (allocations), two under train.compile (its static graph, then the dynamic-shape one
    # a second batch length makes)
    warm = 1 if s.forward is s.model else 2
    starts = [round(i * (per_epoch - t.grad_accum) / (PROBE_STEPS + warm - 1)) for i in range(PROBE_STEPS + warm)]
    weights = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    opt_state, rng = opt.state_dict(), state_io.rng_state()  # the optimizer has no moments yet
    times = []
    model.train()
    for first in starts:
        sampler = batching.RankBatches(order, acc.process_index, t.batch_size, first, first + t.grad_accum)
        loader = batching.make_loader(s.train_ds, sampler, s.collate, columns=s.columns)
        batches = [{k: v.to(acc.device) for k, v in b.items()} for b in loader]
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            with acc.no_sync(model) if i < len(batches) - 1 else contextlib.nullcontext():  # as accumulate does
                acc.backward(s.loss(batch))
        acc.clip_grad_norm_(model.parameters(), t.max_grad_norm if t.max_grad_norm > 0 else math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        acc.unwrap_model(model).load_state_dict(weights)
    opt.load_state_dict(opt_state)
    state_io.set_rng_state(rng, "the time-budget probe")
    return sum(times[warm:]) / len(times[warm:])


def _validation_seconds(s: Any) -> float:
    """One validation: `evaluate` on every k-th row by length, scaled up; its fixed cost counted once."""
    import numpy as np

    from pipeline.inference.backends import for_inference
    from pipeline.training.validation import validate

    n, size = len(s.val_ds), s.cfg.eval.batch_size * SAMPLE_BATCHES * s.acc.num_processes
    order = np.argsort(np.asarray(s.val_ds["length"][:]), kind="stable")
    rows = order[np.linspace(0, n - 1, min(n, size)).round().astype(int)]
    precision = s.eval_precision[0]
    # warm-up, untimed: the metric modules load once per process, not once per validation
    validate(s.acc, s.model, s.val_ds.select(rows[:1]), 1, s.task, s.data_info, precision)
    runtime, scratch, model = s.cfg.eval.runtime, s.cfg.run_dir, s.acc.unwrap_model(s.model)
    if runtime == "onnxruntime":
        from pipeline.inference import onnx_template

        # the run's one export (its template) is made here, untimed (setup's time); then what every validation
        # pays: these weights put into it (+ int8 quantization) and the session loaded
        fixed = onnx_template.replay_seconds(model, precision, scratch)
        # what evaluate pays before predicting depends on these weights (a full export where two tensors are
        # equal, as at initialisation, never after a step): a one-row validation's time is taken off instead
        start = time.perf_counter()
        validate(s.acc, s.model, s.val_ds.select(rows[:1]), 1, s.task, s.data_info, precision, runtime, scratch)
        before = time.perf_counter() - start
    else:
        start = time.perf_counter()
        for_inference(model, precision, s.acc.device, runtime, scratch=scratch)  # int8: the copy each validation makes
        fixed = before = time.perf_counter() - start
    start = time.perf_counter()
    validate(s.acc, s.model, s.val_ds.select(rows), s.cfg.eval.batch_size, s.task, s.data_info, precision, runtime,
             scratch)
    return fixed + max(time.perf_counter() - start - before, 0.0) * n / len(rows)


def _write_seconds(s: Any) -> tuple[float, float]:
    """(checkpoint, export) seconds, from writing + fsyncing + hashing the weights once in the run dir."""
    from safetensors.torch import save_file

    weights, seen = {}, set()
    for k, v in s.acc.unwrap_model(s.model).state_dict().items():  # tied weights (GPT-2's lm_head) saved once,
        if v.untyped_storage().data_ptr() not in seen:             # as checkpoints save them
            seen.add(v.untyped_storage().data_ptr())
            weights[k] = v.detach().contiguous().cpu()
    s.run_dir.mkdir(parents=True, exist_ok=True)
    path = s.run_dir / ".budget-probe.safetensors"
    start = time.perf_counter()
    try:
        save_file(weights, str(path))
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
            hashlib.file_digest(f, "sha256")  # the manifest hashes what was written
    finally:
        path.unlink(missing_ok=True)
    once = time.perf_counter() - start
    return 3 * once, once
