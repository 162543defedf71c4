"""Model, tokenizer, optimizer, learning-rate schedule and precision: built from the config and checked
against each other before any training starts."""

from __future__ import annotations

import importlib
import math
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from pipeline import accel
from pipeline.config import Config, ModelConfig, TrainConfig


def model_source(m: ModelConfig) -> str:
    """A path or hub name; `package:MODULE` means MODULE.get_model_path() (a model shipped in a package)."""
    if not m.name_or_path.startswith("package:"):
        return m.name_or_path
    module = m.name_or_path.split(":", 1)[1]
    try:
        return str(importlib.import_module(module).get_model_path())
    except ImportError:
        raise ValueError(f"model.name_or_path={m.name_or_path!r}: package {module!r} is not installed") from None


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


ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop")  # BERT-likes, DistilBERT, GPT-2


def attention_dropout(m: ModelConfig, src: str) -> dict:
    """The from_pretrained override that sets model.attention_dropout ({} to keep the model's own): the
    attention-dropout attribute of this model type's config, whichever name it has."""
    if m.attention_dropout < 0:
        return {}
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(src)
    key = next((k for k in ATTENTION_DROPOUT_KEYS if hasattr(conf, k)), None)
    if key is None:
        raise ValueError(f"model.attention_dropout={m.attention_dropout:g}: {type(conf).__name__} ({src}) has none of "
                         f"{', '.join(ATTENTION_DROPOUT_KEYS)} to set; leave model.attention_dropout at -1")
    return {key: m.attention_dropout}


def build_model(cfg: Config, tok, label_names: list[str]):
    """AutoModelForSequenceClassification from a pretrained source, or a new BERT/GPT-2 from the config."""
    from transformers import AutoModelForSequenceClassification, BertConfig, GPT2Config

    m = cfg.model
    labels = {"num_labels": len(label_names), "id2label": dict(enumerate(label_names)),
              "label2id": {n: i for i, n in enumerate(label_names)}}
    if not m.from_scratch:
        src = model_source(m)
        model, info = AutoModelForSequenceClassification.from_pretrained(src, output_loading_info=True, **labels,
                                                                         **attention_dropout(m, src))
        if info["missing_keys"] and os.environ.get("RANK", "0") == "0":  # one line, not transformers' report table
            print(f"new, randomly initialised (expected for a new task): {', '.join(sorted(info['missing_keys']))}",
                  flush=True)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id
        return model
    positions = max(cfg.tokenize.max_length, 8)
    positions = -(-positions // 8) * 8  # room for padding to a multiple of 8
    if m.from_scratch == "bert":
        conf = BertConfig(
            vocab_size=len(tok), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
            hidden_dropout_prob=m.dropout,
            attention_probs_dropout_prob=m.dropout if m.attention_dropout < 0 else m.attention_dropout,
            max_position_embeddings=positions, pad_token_id=tok.pad_token_id, **labels,
        )
    else:
        conf = GPT2Config(
            vocab_size=len(tok), n_positions=positions, n_embd=m.hidden_size, n_layer=m.num_layers,
            n_head=m.num_heads, n_inner=m.intermediate_size, resid_pdrop=m.dropout, embd_pdrop=m.dropout,
            attn_pdrop=m.dropout if m.attention_dropout < 0 else m.attention_dropout, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id,
            eos_token_id=tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id, **labels,
        )
    return AutoModelForSequenceClassification.from_config(conf)


def check_fit(model, tok, train_ds, max_length: int, where: str) -> None:
    """The model must embed every token id and position the data holds; say which to change if not."""
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
            f"{where}: tokenize.max_length={max_length} (longest text {longest} tokens) exceeds the model's "
            f"{positions} positions; lower tokenize.max_length to {positions} or less and rerun prepare"
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


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Fraction of the peak rate at 0-based optimizer step `step`: linear warmup reaching 1 at
    step warmup-1, then cosine from 1 (step warmup) down towards min_ratio (at step total)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model, t: TrainConfig, total_steps: int):
    """AdamW and its LambdaLR schedule (stepped by us once per optimizer step, never per process)."""
    import torch

    # fused: one kernel for all parameters (cpu/cuda); the per-tensor loop took ~2.4x longer per step on MiniLM
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, fused=fused or None)
    warmup = math.ceil(t.warmup_ratio * total_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(lr_factor, total=total_steps, warmup=warmup, min_ratio=t.min_lr_ratio)
    )
    return opt, sched


def choose_precision(t: TrainConfig, has_gpu: bool) -> str:
    """The mixed precision to run: the config's, else accelerate's (launch sets the env variable)."""
    mp = t.mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION", "no") or "no"
    if mp == "fp16" and not has_gpu:
        raise ValueError(
            "mixed precision fp16 needs a GPU and none is visible; set train.mixed_precision=no "
            "(or bf16 on a CPU with native bf16), or fix mixed_precision in accelerate_config.yaml"
        )
    if mp == "bf16" and not has_gpu and not accel.cpu_has_native_bf16():
        cost = ("this CPU has no native bf16 (no AVX512-BF16/AMX): bf16 matmuls are emulated, "
                "measured here at about 0.5 GFLOP/s against about 150 GFLOP/s in fp32 (15-300x slower)")
        if not t.allow_slow_bf16:
            raise ValueError(f"mixed precision bf16 refused: {cost}. Use train.mixed_precision=no, "
                             "or set train.allow_slow_bf16=true to run it anyway")
        print(f"\n{'!' * 78}\nWARNING: bf16 forced with train.allow_slow_bf16=true; {cost}\n{'!' * 78}\n",
              file=sys.stderr, flush=True)
    return mp


def describe(model: Any) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({n / 1e6:.2f} M parameters)"
