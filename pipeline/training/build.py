"""Tokenizer, optimizer, learning-rate schedule and precision, built from the config, and the checks of the
model (which the task builds) against the data before any training starts."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pipeline import accel
from pipeline.schema import TrainConfig


def load_tokenizer(tokenizer_dir: Path, from_scratch: str):
    """The tokenizer prepare saved. A GPT-2 built from scratch gets a pad token if the tokenizer lacks one."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if tok.pad_token is None:
        if from_scratch:
            tok.add_special_tokens({"pad_token": "<pad>"})  # the new model's vocabulary includes it
        elif tok.eos_token is not None:
            tok.pad_token = tok.eos_token  # GPT-2 convention; classification reads the last non-pad token
        else:
            raise ValueError(f"tokenizer in {tokenizer_dir} has no pad token and no eos token to pad with")
    tok.padding_side = "right"
    return tok


def check_fit(model, tok, train_ds, max_length: int, where: str, setting: str = "tokenize.max_length") -> None:
    """The model must embed every token id and position the data holds; say which to change if not (`setting`:
    the one that bounds an example's tokens, Task.max_tokens_setting)."""
    import pyarrow.compute as pc

    conf = model.config
    vocab = conf.vocab_size
    positions = getattr(conf, "max_position_embeddings", None) or getattr(conf, "n_positions", None)
    if len(tok) > vocab:
        raise ValueError(
            f"{where}: the tokenizer has {len(tok)} tokens but the model embeds only {vocab}; "
            f"use the model's own tokenizer (tokenize.kind=pretrained) or a from-scratch model"
        )
    table = train_ds.data.table if hasattr(train_ds.data, "table") else train_ds.data
    ids = pc.list_flatten(table.column("input_ids"))
    top = pc.max(ids).as_py() if len(ids) else 0
    if top is not None and top >= vocab:
        raise ValueError(f"{where}: the train split holds token id {top} but the model's vocabulary has {vocab}")
    longest = pc.max(table.column("length")).as_py() or 0
    if positions and max(longest, max_length) > positions:
        raise ValueError(
            f"{where}: {setting}={max_length} (longest example {longest} tokens) exceeds the model's "
            f"{positions} positions; lower {setting} to {positions} or less and rerun prepare"
        )


def param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on weights, none on biases and normalisation weights."""
    import torch

    norm_types = (torch.nn.LayerNorm, torch.nn.GroupNorm)
    no_decay = set()
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if p_name == "bias" or isinstance(mod, norm_types) or "norm" in type(mod).__name__.lower():
                no_decay.add(full)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n not in no_decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0},
    ]


def lr_factor(step: int, total: int, warmup: int, min_ratio: float, kind: str = "cosine", decay: float = 0.1) -> float:
    """Fraction of the peak rate at 0-based optimizer step `step`: linear warmup reaching 1 at step warmup-1,
    then (`kind`, train.lr_schedule) cosine or linear from 1 (step warmup) down towards min_ratio (at step total),
    constant at 1, or wsd: 1 until the last ceil(decay x total) steps, which fall linearly to min_ratio (reached
    at step total). A wsd factor before its decay depends on nothing but the step: a longer run is the same
    run until its own decay starts."""
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "wsd":
        decay_steps = max(1, math.ceil(decay * total))
        start = max(warmup, total - decay_steps)
        progress = min(1.0, max(0.0, (step - start) / max(1, total - start)))
        return 1.0 - (1.0 - min_ratio) * progress
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule(optimizer, t: TrainConfig, total_steps: int):
    """train.lr_schedule's LambdaLR on `optimizer` for `total_steps` (stepped by us once per optimizer step, never
    per process)."""
    import torch

    warmup = math.ceil(t.warmup_ratio * total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(
        lr_factor, total=total_steps, warmup=warmup, min_ratio=t.min_lr_ratio, kind=t.lr_schedule,
        decay=t.decay_ratio))


OPTIMIZER_EXTRAS = {"lion": ("lion_pytorch", "lion")}  # train.optimizer -> (module it needs, the pip extra)


def check_optimizer(t: TrainConfig) -> None:
    """Before any work: the optimizer's package is installed (one line naming its extra)."""
    if t.optimizer in OPTIMIZER_EXTRAS:
        module, extra = OPTIMIZER_EXTRAS[t.optimizer]
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise ValueError(f"train.optimizer={t.optimizer} needs {module.replace('_', '-')}: pip install -c "
                             f"constraints.txt -e '.[{extra}]' (or choose adamw, adafactor or sgd)")


def build_optimizer(model, t: TrainConfig, total_steps: int):
    """train.optimizer and its LambdaLR schedule (stepped by us once per optimizer step, never per process).
    Every optimizer's state is its state_dict, which accelerate's save_state/load_state keep exactly."""
    import torch

    groups = param_groups(model, t.weight_decay)
    if t.optimizer == "adafactor":
        opt = torch.optim.Adafactor(groups, lr=t.lr)
    elif t.optimizer == "sgd":
        opt = torch.optim.SGD(groups, lr=t.lr, momentum=t.momentum)
    elif t.optimizer == "lion":  # its package checked before any work (check_optimizer, in setup.prepare_run)
        from lion_pytorch import Lion

        opt = Lion(groups, lr=t.lr)
    else:
        # fused: one kernel for all parameters (cpu/cuda); the per-tensor loop took ~2.4x longer per step on MiniLM
        fused = next(model.parameters()).device.type in ("cpu", "cuda")
        opt = torch.optim.AdamW(groups, lr=t.lr, fused=fused or None)
    return opt, schedule(opt, t, total_steps)


@dataclass(frozen=True)
class Precision:
    """The mixed precision a launch runs (`run`), the one its checkpoints are fingerprinted with (`kept`: a
    resumed `auto` run keeps its first launch's, even where it cannot run it), and why, for the log."""

    run: str
    kept: str
    why: str


def choose_precision(t: TrainConfig, device_type: str, recorded: str | None = None) -> Precision:
    """The mixed precision to run ("no", "bf16" or "fp16").

    - train.mixed_precision no, bf16 or fp16: that one; empty: accelerate's ($ACCELERATE_MIXED_PRECISION, which
      `accelerate launch` sets from its config and flags), else no.
    - auto (the default): accelerate's where it names bf16 or fp16. Else, on a resume, the choice the run made at
      its first launch (`recorded`), where this device can run it. Else bf16 where the device computes bf16
      natively (accel.native_bf16), no elsewhere. `accelerate launch` always exports "no" when nothing is set,
      so "no" from accelerate does not override auto: train.mixed_precision=no does.
    """
    env = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") or "no"
    setting = t.mixed_precision
    if setting == accel.AUTO and env == "no":
        return _auto(device_type, recorded)
    mp = setting if setting not in ("", accel.AUTO) else env
    why = "train.mixed_precision" if setting not in ("", accel.AUTO) else "accelerate's mixed_precision"
    if mp == "fp16" and device_type != "cuda":
        raise ValueError(
            "mixed precision fp16 needs a GPU and none is visible; set train.mixed_precision=no "
            "(or bf16 on a CPU with native bf16), or fix mixed_precision in accelerate_config.yaml"
        )
    if mp == "bf16" and device_type == "cpu" and not accel.cpu_has_native_bf16():
        cost = ("this CPU has no native bf16 (no AVX512-BF16/AMX): bf16 matmuls are emulated, "
                "measured here at about 0.5 GFLOP/s against about 150 GFLOP/s in fp32 (15-300x slower)")
        if not t.allow_slow_bf16:
            raise ValueError(f"mixed precision bf16 refused: {cost}. Use train.mixed_precision=no, "
                             "or set train.allow_slow_bf16=true to run it anyway")
        print(f"\n{'!' * 78}\nWARNING: bf16 forced with train.allow_slow_bf16=true; {cost}\n{'!' * 78}\n",
              file=sys.stderr, flush=True)
    return Precision(mp, mp, why)


def _auto(device_type: str, recorded: str | None) -> Precision:
    native = accel.native_bf16(device_type)
    detected = "bf16" if native else "no"
    if recorded is None:
        return Precision(detected, detected, f"auto: {accel.why_precision(device_type)}")
    runnable = {"no": True, "bf16": native, "fp16": device_type == "cuda"}.get(recorded, False)
    if runnable:
        return Precision(recorded, recorded, "auto: kept from the run's first launch")
    return Precision("no", recorded, f"auto: the run's first launch chose {recorded}, which this {device_type} does "
                     f"not compute natively ({accel.why_precision(device_type)}); it goes on in fp32, so from here "
                     f"its updates differ from a run that never stopped")


def training_attention(setting: str, precision: str, device_type: str, cpu_bf16: str) -> str | None:
    """The attention implementation to train with (train.attention), or None for the model's own. auto: the task's
    choice for bf16 on a CPU (Task.cpu_bf16_attention; a sequence classifier's is eager, where torch's SDPA kernels
    are slower than eager attention in bf16, bench/results/train.md: 1.26x a step at ~30 tokens, 1.4x at ~200, MiniLM
    with attention dropout 0); elsewhere, and for tasks without a choice (the LM tasks, their packed-document
    masks), the model's own."""
    if setting != accel.AUTO:
        return setting
    return (cpu_bf16 or None) if precision == "bf16" and device_type == "cpu" else None


def can_compile(on: bool, device_type: str) -> bool:
    """train.compile: whether inductor can compile here. A CPU without the C++ compiler inductor builds its kernels
    with gets one warning and eager mode, not a failure at the first step."""
    if not on or device_type != "cpu":
        return on
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()  # inductor's own search (its config.cpp.cxx, $CXX)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"warning: train.compile=true needs a C++ compiler on a CPU and inductor found none ({why}); training "
              f"in eager mode", file=sys.stderr)
        return False
    return True


def compiled(model: Any) -> Any:
    """The forward that training and validation call under train.compile: torch.compile of the prepared model (its
    parameters, the same tensors; checkpoints, samples and final/ use the model itself, never a compiled graph)."""
    import torch

    return torch.compile(model)


def describe(model: Any) -> str:
    n = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    part = f", {trained / 1e6:.3f} M of them trained ({100 * trained / max(n, 1):.2f}%)" if trained < n else ""
    return f"{type(model).__name__} ({n / 1e6:.2f} M parameters{part})"


def warm_start(model, folder: str) -> None:
    """Load the weights of `folder` (a step checkpoint or a final/ export, verified against its manifest) into
    `model`, which must have the same parameters; ties (GPT-2's lm_head) are kept. The optimizer is not touched:
    the run starts from these weights with a fresh one (the chapter's warm start)."""
    from safetensors.torch import load_file

    from pipeline import artifacts

    path = Path(folder).expanduser()
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"train.init_from: {path} holds no model.safetensors; point it at a step checkpoint "
                                f"(run/checkpoints/step-N) or a final export (run/final)")
    problem = artifacts.check_files(path, deep=True) if (path / artifacts.MANIFEST).is_file() else None
    if problem:
        raise ValueError(f"train.init_from: {path} {problem}; it cannot be trusted as a starting point")
    state = load_file(str(weights))
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    unknown = [k for k in state if k not in own]
    if wrong or unknown:
        k = (wrong or unknown)[0]
        what = f"has shape {tuple(state[k].shape)}, this model's {tuple(own[k].shape)}" if wrong else "is not in this model"
        raise ValueError(f"train.init_from: {weights}: {k} {what}; start from a checkpoint of the same model and "
                         f"vocabulary")
    missing = set(own) - set(state)
    model.load_state_dict(state, strict=False)
    model.tie_weights()  # a checkpoint stores a tied tensor once
    shared = {k for k in missing if any(own[k].data_ptr() == own[j].data_ptr() for j in state if j in own)}
    if missing - shared:
        raise ValueError(f"train.init_from: {weights} lacks {sorted(missing - shared)[0]} of this model; start from a "
                         f"checkpoint of the same model")
