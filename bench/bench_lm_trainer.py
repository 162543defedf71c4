"""Causal LM training: this project's loop against a run_clm-style transformers.Trainer, side by side in one run.

    python bench/bench_lm_trainer.py [--steps 150] [--warmup 3] [--rounds 2] [--boundaries-none]

The plays and the model of configs/shakespeare.yaml (a 6.85 M-parameter GPT-2 from scratch, byte-level BPE
of 8,000 trained on the train plays, blocks of 256 tokens, batch 16), the same schedule (lr 1e-3, warmup
10%, cosine to 0.1, clipping 1.0, weight decay 0.01, fused AdamW, dropout 0.1, seed 42), the same machine and
threads, in fp32 and (a CPU with native bf16) bf16 autocast (Trainer's bf16=True), each eager and compiled (ours
train.compile=true, Trainer's torch_compile=True; the compile falls in the warmup steps):

- ours, `lm.boundaries: document` (the default: positions restart at each play, no token attends to
  another play's) and, with --boundaries-none, `none` (plain concatenation), each prepared by `pipeline/prepare.py`;
- Trainer as transformers' examples/pytorch/language-modeling/run_clm.py does it: the train plays'
  cleaned text tokenized by the same tokenizer, concatenated, cut into blocks of 256 (`group_texts`),
  `default_data_collator`, labels = input_ids.

Each variant runs `--steps` + `--warmup` optimizer steps in its own process, in `--rounds` interleaved
rounds (best tokens/s kept: compare ratios, the machine drifts); tokens/s counts the steps after the warmup. The
ratio column is against Trainer at its best at the same precision (compiled or not, whichever was faster). Every
final model is then scored by `pipeline/evaluate.py --checkpoint` on the same validation
blocks (the held-out plays, document boundaries): perplexity and bits per byte at equal steps.
Prints a markdown table and this CPU's flags.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CONFIG = REPO / "configs" / "shakespeare.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def pipeline_cmd(script: str, out: Path, *extra: str) -> list[str]:
    """prepare, and evaluate in fp32 (every variant scored alike; a variant's training precision is its own)."""
    fp32 = {"train.py": ["train.mixed_precision=no"], "evaluate.py": ["eval.precision=fp32"]}.get(script, [])
    return [sys.executable, str(REPO / "pipeline" / script), "--config", str(CONFIG), f"output_dir={out}", *fp32, *extra]


def run_ours(out: Path, steps: int, warmup: int, bf16: bool = False, compile: bool = False) -> dict:
    """bench_train.py's runner of our loop, on the data prepared in `out` (its name says the boundaries)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_train import run_ours as timed_run

    extra = [f"output_dir={out}", f"lm.boundaries={out.name.split('-', 1)[1]}",
             *(["train.mixed_precision=bf16"] if bf16 else []), *(["train.compile=true"] if compile else [])]
    return {**timed_run(CONFIG, steps, warmup, 16, extra), "model": str(out / "run" / "final")}


def run_trainer(out: Path, steps: int, warmup: int, bf16: bool = False, compile: bool = False) -> dict:
    """run_clm's recipe on the data `out` was prepared with (its train split's text and tokenizer)."""
    import datasets
    from transformers import (
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.tasks.causal_lm.model import build_model

    cfg = load_config(CONFIG, [f"output_dir={out}"])
    prep = load_prepared(cfg, tasks.get(cfg.task))
    tok = AutoTokenizer.from_pretrained(str(prep.tokenizer_dir))
    split_stage = next(p for p in (cfg.data_dir / "stages").iterdir() if p.name.split("-")[1] == "split")
    texts = datasets.load_from_disk(str(split_stage / "data"))["train"]["text"]
    ids = [i for t in texts for i in tok(t)["input_ids"]]  # tokenize, then run_clm's group_texts
    size = cfg.lm.block_size
    blocks = [ids[i : i + size] for i in range(0, len(ids) - size + 1, size)]
    train_ds = datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks})
    set_seed(cfg.train.seed)
    model = build_model(cfg, tok, prep.info)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    t = cfg.train
    args = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=t.batch_size, max_steps=steps + warmup,
        learning_rate=t.lr, warmup_steps=int(t.warmup_ratio * (steps + warmup)), weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": t.min_lr_ratio}, optim="adamw_torch_fused", save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=10_000, seed=t.seed,
        dataloader_drop_last=True, bf16=bf16, torch_compile=compile,
    )
    Trainer(model=model, args=args, train_dataset=train_ds, data_collator=default_data_collator,
            callbacks=[Clock()]).train()
    seconds = stamps[warmup + steps - 1] - stamps[warmup - 1]
    final = out / "trainer" / "final"
    model.save_pretrained(str(final))
    tok.save_pretrained(str(final))
    return {"tokens_per_s": steps * t.batch_size * size / seconds, "s_per_step": seconds / steps, "model": str(final),
            "train_tokens": len(ids), "blocks": len(blocks)}


def child(args) -> None:
    out = Path(args.out)
    run = run_trainer if args.variant.startswith("trainer") else run_ours
    res = run(out, args.steps, args.warmup, bf16="bf16" in args.variant, compile="compile" in args.variant)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res), flush=True)


def spawn(variant: str, out: Path, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--variant", variant, "--out", str(out), "--steps", str(steps), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{variant} failed:\n{proc.stderr[-3000:]}")
    print(f"  {variant}: {line[0][7:]}", file=sys.stderr, flush=True)
    return json.loads(line[0][7:])


def score(reference: Path, model: str) -> dict:
    """Validation perplexity and bits per byte of `model`, by evaluate.py on the reference's blocks."""
    cmd = pipeline_cmd("evaluate.py", reference, "--split", "validation", "--checkpoint", model)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"evaluate {model} failed:\n{proc.stderr[-3000:]}")
    found = sorted((reference / "run" / "eval").glob("validation-*/metrics.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text())["lm"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; each variant's best tokens/s is kept")
    p.add_argument("--variant")
    p.add_argument("--out")
    p.add_argument("--boundaries-none", action="store_true", help="also ours with lm.boundaries=none (fp32)")
    args = p.parse_args()
    if args.variant:
        return child(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench_lm_trainer_"))
    for b in ("document", "none"):
        subprocess.run(pipeline_cmd("prepare.py", tmp / f"ours-{b}", f"lm.boundaries={b}"), check=True,
                       capture_output=True, env=ENV, cwd=REPO)
    variants = {}
    from pipeline.accel import cpu_has_native_bf16

    for precision in ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",):  # emulated bf16: no race
        for compiled in ("", ", compiled"):
            tag = f"{'-bf16' if precision == 'bf16' else ''}{'-compile' if compiled else ''}"
            variants[f"Trainer, run_clm (concatenate and chunk), {precision}{compiled}"] = (f"trainer{tag}",
                                                                                            tmp / "ours-document")
            variants[f"ours, lm.boundaries=document (default), {precision}{compiled}"] = (f"ours{tag}",
                                                                                          tmp / "ours-document")
    if args.boundaries_none:
        variants["ours, lm.boundaries=none, fp32"] = ("ours", tmp / "ours-none")
    res: dict = {}
    for round_ in range(args.rounds):  # interleaved: the machine drifts, and a variant's best round is its speed
        for name, (variant, out) in variants.items():
            r = spawn(variant, out, args.steps, args.warmup)
            kept = tmp / "models" / f"{variant}-round{round_}"
            shutil.copytree(r["model"], kept)  # the variants of a side share a run folder: each one's own final model
            r["model"] = str(kept)
            if name not in res or r["tokens_per_s"] > res[name]["tokens_per_s"]:
                res[name] = r
    for r in res.values():
        r["eval"] = score(tmp / "ours-document", r["model"])
    from pipeline.accel import describe_cpu

    print(f"{describe_cpu()}; {args.rounds} round(s)")
    print(table(res, args.steps + args.warmup))


def table(res: dict, steps: int) -> str:
    def base(name: str) -> float:  # Trainer at its best at this precision: compiled or not, whichever was faster
        precision = "bf16" if "bf16" in name else "fp32"
        return max(r["tokens_per_s"] for k, r in res.items() if k.startswith("Trainer") and f", {precision}" in k)

    lines = [f"| variant | tokens/s | vs Trainer at its best, same precision | s/step | peak RSS MB | validation perplexity after {steps} steps | bits per byte |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base(name):.2f}x | {r['s_per_step']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['eval']['perplexity']:.1f} | {r['eval']['bits_per_byte']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
