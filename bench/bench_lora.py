"""LoRA against full fine-tuning, with this project's own loop, side by side in one run.

    python bench/bench_lora.py [--models minilm,smollm2] [--minilm-steps 150] [--smollm2-steps 8]

- minilm: configs/default.yaml (all-MiniLM-L6-v2, 22.7 M parameters, the tweets, max_length 64, batch 32);
  full fine-tuning at the config's lr 1e-4, LoRA (r 8, alpha 16, query and value, the head trained in full)
  at lr 1e-3 (adapters train at a higher rate: the LoRA paper's GLUE runs use 4e-4 to 5e-4 on RoBERTa-base).
- smollm2: configs/smollm2_shakespeare.yaml (SmolLM2-135M-Instruct, 134.5 M) with blocks of 128, batch 4,
  and validation on one held-out play (split.validation 0.03, so that a validation takes about a minute on two
  cores); full at lr 5e-5, LoRA (r 8, q_proj and v_proj) at lr 5e-4.

Each variant trains `--*-steps` optimizer steps in its own process (peak RSS of that process tree), validates
once at the end and saves one checkpoint. Reported: seconds per step (the steps after the first log window),
peak RSS, the checkpoint's size (everything resume reads), the validation metric at equal steps, and a second
LoRA run given the full run's training time (more steps): the metric at equal wall-clock time.
Prints a markdown table and this CPU's flags.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

MODELS = {
    "minilm": {"config": "configs/default.yaml", "metric": "accuracy", "data": [],
               "full": ["train.lr=1e-4"], "lora": ["peft.method=lora", "train.lr=1e-3"]},
    "smollm2": {"config": "configs/smollm2_shakespeare.yaml", "metric": "perplexity",
                "data": ["lm.block_size=128", "split.train=0.87", "split.validation=0.03"],
                "full": ["train.lr=5e-5", "train.batch_size=4"],
                "lora": ["peft.method=lora", "train.lr=5e-4", "train.batch_size=4"]},
}


def cmd(script: str, model: str, out: Path, *extra: str) -> list[str]:
    m = MODELS[model]
    return [sys.executable, str(REPO / "pipeline" / script), "--config", str(REPO / m["config"]),
            f"output_dir={out}", *m["data"], *extra]


def child(args) -> None:
    """One training run; prints its result as the last line (peak RSS: this process's children)."""
    out = Path(args.out)
    extra = [*MODELS[args.model][args.variant], f"train.max_steps={args.steps}", "train.eval_every=0",
             "train.save_every=0", "train.log_every=2", "train.keep_best=0", "train.keep_last=1"]
    started = time.perf_counter()
    done = subprocess.run(cmd("train.py", args.model, out, *extra), env=ENV, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{args.variant} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r and "eval" not in r and "event" not in r][1:]  # after the first window
    evals = [r["eval"] for r in records if "eval" in r]
    ckpt = max((out / "run" / "checkpoints").iterdir())
    print(json.dumps({
        "s_per_step": sum(r["seconds"] for r in train) / max(1, sum(r["steps"] for r in train)),
        "train_seconds": sum(r["seconds"] for r in records if "seconds" in r),
        "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "ckpt_mb": sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) / 2**20,
        "metric": evals[-1][MODELS[args.model]["metric"]], "steps": args.steps,
        "wall_s": time.perf_counter() - started,
    }))


def spawn(model: str, variant: str, out: Path, steps: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", "--model", model, "--variant", variant,
                           "--out", str(out), "--steps", str(steps)], env=ENV, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(model: str, steps: int, root: Path) -> dict:
    data = root / model
    subprocess.run(cmd("prepare.py", model, data), env=ENV, cwd=REPO, check=True, capture_output=True)
    res = {}
    for variant in ("full", "lora"):
        out = root / f"{model}-{variant}"
        out.mkdir()
        os.symlink(data / "data", out / "data")
        res[variant] = spawn(model, variant, out, steps)
        print(model, variant, res[variant], flush=True)
    # equal wall-clock: LoRA given the full run's training time
    more = max(steps, int(res["full"]["s_per_step"] * steps / res["lora"]["s_per_step"]))
    out = root / f"{model}-lora-time"
    out.mkdir()
    os.symlink(data / "data", out / "data")
    res["lora_time"] = spawn(model, "lora", out, more)
    print(model, "lora, equal time", res["lora_time"], flush=True)
    return res


def table(model: str, res: dict) -> str:
    full, lora, timed = res["full"], res["lora"], res["lora_time"]
    metric = MODELS[model]["metric"]
    rows = [
        "| variant | s/step | vs full | peak RSS MB | checkpoint MB | vs full | "
        f"validation {metric} at {full['steps']} steps | steps in full's time | {metric} then |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| full fine-tuning | {full['s_per_step']:.3f} | 1.00x | {full['rss_mb']:.0f} | {full['ckpt_mb']:.2f} | 100% | "
        f"{full['metric']:.4g} | {full['steps']} | {full['metric']:.4g} |",
        f"| LoRA r 8 | {lora['s_per_step']:.3f} | {full['s_per_step'] / lora['s_per_step']:.2f}x | {lora['rss_mb']:.0f} | "
        f"{lora['ckpt_mb']:.2f} | {100 * lora['ckpt_mb'] / full['ckpt_mb']:.2f}% | {lora['metric']:.4g} | "
        f"{timed['steps']} | {timed['metric']:.4g} |",
    ]
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="minilm,smollm2")
    p.add_argument("--minilm-steps", type=int, default=150)
    p.add_argument("--smollm2-steps", type=int, default=8)
    p.add_argument("--child", action="store_true")
    p.add_argument("--model")
    p.add_argument("--variant")
    p.add_argument("--out")
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    if args.child:
        return child(args)
    from pipeline.accel import describe_cpu

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as tmp:
        for model in args.models.split(","):
            results[model] = bench(model, getattr(args, f"{model}_steps"), Path(tmp))
    print(f"\nCPU: {describe_cpu()}")
    for model, res in results.items():
        print(f"\n{model}\n\n{table(model, res)}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
