"""The textbook chapter's hands-on experiments, run with the pipeline's own switches on configs/shakespeare.yaml.

    python bench/lm_experiments.py [--steps 200] [--out outputs/lm_experiments] [--only NAME ...]

Every run is `pipeline/train.py --config configs/shakespeare.yaml` with overrides, in its own output folder
(prepared by `pipeline/prepare.py`), on the same 200-step schedule (warmup 20 steps to the peak, cosine
to 0.1 of it), so that a run stopped early by SIGTERM (the pipeline's graceful stop: a checkpoint, exit
75) has seen exactly the learning rates of the reference run up to that step:

1. base         lr 1e-3 (the config's), validation every 50 steps: the TensorBoard curves (figure).
2. lr           lr 1e-2 with clipping at 1.0, without clipping, and lr 1e-1 without clipping, each stopped at
                step 80: where the loss goes, whether and at which step it turns NaN, and what
                train.nan_policy (skip; halt after 5 in a row) did.
3. determinism  train.deterministic true and false, two runs each, stopped at step 25: are the losses of
                two runs bitwise equal, and what the switch costs per step.
4. resume       from base's step-100 checkpoint: resumed (optimizer state kept: `--resume`) and warm-started
                (weights only, a fresh AdamW: train.init_from), without and with a 10-step warmup; the
                loss in the 50 steps after.

Writes docs/figures/lm-*.png and bench/results/lm_experiments.json (with the machine's CPU flags), and
prints the tables of docs/language-models.md. About 45 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "shakespeare.yaml"
FIGURES = REPO / "docs" / "figures"
RESULTS = REPO / "bench" / "results" / "lm_experiments.json"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def prepare(out: Path) -> None:
    cmd = [sys.executable, str(REPO / "pipeline" / "prepare.py"), "--config", str(CONFIG), f"output_dir={out}"]
    subprocess.run(cmd, check=True, capture_output=True, env=ENV, cwd=REPO)


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    rows = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # being written
            pass
    return rows


def train(out: Path, *overrides: str, stop_at: int = 0, resume: str = "", steps: int) -> dict:
    """One train.py process; SIGTERM once step `stop_at` is logged (0: run to the end). Returns the exit code,
    the wall time and the per-step records."""
    if not (out / "data").exists():
        prepare(out)
    if not resume:  # a rerun starts afresh: an old metrics.jsonl would stop it at once
        shutil.rmtree(out / "run", ignore_errors=True)
    cmd = [sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(CONFIG), f"output_dir={out}",
           f"train.max_steps={steps}", "train.log_every=1", "train.save_every=100", "train.keep_last=5",
           "train.eval_every=0", *overrides, *(["--resume", resume] if resume else [])]
    log = out / f"train-{int(time.time())}.log"
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=ENV, cwd=REPO)
        while proc.poll() is None:
            if stop_at and any(r.get("step", 0) >= stop_at and "loss" in r for r in records(out / "run")):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.2)
        code = proc.wait()
    rows = records(out / "run")
    print(f"  {out.name}: exit {code}, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return {"exit": code, "seconds": time.perf_counter() - start, "log": log.read_text()[-4000:],
            "steps": [r for r in rows if "loss" in r and "eval" not in r and "event" not in r],
            "evals": [r for r in rows if "eval" in r], "events": [r for r in rows if "event" in r]}


# ---------------------------------------------------------------- the experiments


def exp_base(root: Path, steps: int) -> dict:
    return train(root / "base", "train.eval_every=50", steps=steps)


def exp_lr(root: Path, steps: int) -> dict:
    variants = {"lr 1e-2, clip 1.0": ["train.lr=1e-2"],
                "lr 1e-2, no clipping": ["train.lr=1e-2", "train.max_grad_norm=0"],
                "lr 1e-1, no clipping": ["train.lr=1e-1", "train.max_grad_norm=0"]}
    out = {}
    for i, (name, over) in enumerate(variants.items()):
        r = train(root / f"lr{i}", *over, stop_at=80, steps=steps)
        bad = [e["step"] for e in r["events"] if e.get("event") == "nonfinite"]  # loss is a string ("nan") there
        out[name] = {**r, "first_nonfinite_step": bad[0] if bad else None, "skipped": len(bad)}
    return out


def exp_determinism(root: Path, steps: int) -> dict:
    out = {}
    for det in ("true", "false"):
        for k in (1, 2):
            out[f"deterministic={det} #{k}"] = train(root / f"det-{det}-{k}", f"train.deterministic={det}",
                                                     stop_at=25, steps=steps)
    return out


def exp_resume(root: Path, steps: int, base: dict) -> dict:
    ckpt = root / "base" / "run" / "checkpoints" / "step-0000100"
    lr100 = next(r["lr"] for r in base["steps"] if r["step"] == 101)  # the lr of the first step after it
    out = {}
    exact = root / "resume-exact"  # base's run folder in a folder of its own, as after a crash at step 100
    shutil.rmtree(exact / "run", ignore_errors=True)
    exact.mkdir(exist_ok=True)
    prepare(exact)
    shutil.copytree(root / "base" / "run", exact / "run", symlinks=True)
    for p in (exact / "run" / "checkpoints").iterdir():
        if p.name != ckpt.name:
            shutil.rmtree(p)
    shutil.rmtree(exact / "run" / "final", ignore_errors=True)
    metrics = exact / "run" / "metrics.jsonl"  # what a crash right after step 100 leaves: nothing logged past it
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line).get("step", 0) <= 100]
    metrics.write_text("".join(line + "\n" for line in kept))
    out["resumed (optimizer state kept)"] = train(exact, "train.eval_every=50", resume="auto", stop_at=150, steps=steps)
    # a fresh AdamW at the learning rate the base run had there, cosine to the same floor over the 100 steps left
    floor = 0.1 * 1e-3 / lr100
    fresh = [f"train.init_from={ckpt}", f"train.lr={lr100}", f"train.min_lr_ratio={floor}"]
    out["weights only, no warmup"] = train(root / "warm-0", *fresh, "train.warmup_ratio=0", stop_at=50, steps=100)
    out["weights only, 10-step warmup"] = train(root / "warm-10", *fresh, "train.warmup_ratio=0.1", stop_at=50, steps=100)
    return out


# ---------------------------------------------------------------- figures and tables


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict = {}
    for events in sorted({p.parent for p in (run / "tensorboard").rglob("events.*")}):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def figures(res: dict, root: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    if "base" in res:
        tb = tensorboard_scalars(root / "base" / "run")
        tags = [t for t in ("train/loss", "train/lr", "train/grad_norm", "eval/perplexity", "eval/bits_per_byte",
                            "train/tokens_per_s") if t in tb]
        fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
        for ax, tag in zip(axes.flat, tags):
            xs, ys = zip(*sorted(tb[tag]))
            ax.plot(xs, ys, marker="o" if tag.startswith("eval") else None, lw=1)
            ax.set_title(tag)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.suptitle("configs/shakespeare.yaml, the first 200 steps, read back from the run's TensorBoard events")
        fig.tight_layout()
        fig.savefig(FIGURES / "lm-tensorboard.png", dpi=90)
        plt.close(fig)
    if "lr" in res and "base" in res:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        base = [(r["step"], r["loss"]) for r in res["base"]["steps"] if r["step"] <= 80]
        ax.plot(*zip(*base), label="lr 1e-3, clip 1.0 (the config)", lw=1.2)
        for name, r in res["lr"].items():
            pts = [(s["step"], float(s["loss"])) for s in r["steps"]]
            ax.plot(*zip(*pts), label=name, lw=1.2)
            for e in r["events"]:
                if e.get("event") == "nonfinite":
                    ax.axvline(e["step"], color="red", alpha=0.25, lw=0.8)
        save_loss_figure(fig, ax, "Learning rate: warmup to the peak over 20 steps (red: non-finite, update skipped)",
                         "lm-learning-rate.png")
    if "resume" in res and "base" in res:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot(*zip(*[(r["step"], r["loss"]) for r in res["base"]["steps"] if 80 <= r["step"] <= 150]),
                label="never stopped", lw=2.5, alpha=0.5)
        for name, r in res["resume"].items():
            shift = 0 if name.startswith("resumed") else 100
            pts = [(s["step"] + shift, s["loss"]) for s in r["steps"] if s["step"] + shift > 100]
            ax.plot(*zip(*pts), label=name, lw=1.2, ls="--" if name.startswith("resumed") else "-")
        ax.axvline(100, color="grey", lw=0.8)
        save_loss_figure(fig, ax, "Restarting from step 100's checkpoint with and without the optimizer state",
                         "lm-resume.png")


def save_loss_figure(fig, ax, title: str, name: str) -> None:
    import matplotlib.pyplot as plt

    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(FIGURES / name, dpi=90)
    plt.close(fig)


def mean_loss(steps: list[dict], first: int, last: int) -> float:
    xs = [float(s["loss"]) for s in steps if first <= s["step"] <= last]
    return sum(xs) / len(xs) if xs else float("nan")


def summary(res: dict) -> dict:
    """The numbers the docs quote."""
    out: dict = {}
    if "base" in res:
        b = res["base"]
        out["base"] = {"evals": {r["step"]: r["eval"] for r in b["evals"]},
                       "s_per_step": sum(r["seconds"] for r in b["steps"]) / len(b["steps"]),
                       "loss_at": {s: next(r["loss"] for r in b["steps"] if r["step"] == s) for s in (20, 50, 80, 100, 150)},
                       "mean_loss_71_80": mean_loss(b["steps"], 71, 80)}
    if "lr" in res:
        out["lr"] = {}
        for name, r in res["lr"].items():
            losses = [float(s["loss"]) for s in r["steps"]]
            finite = [x for x in losses if math.isfinite(x)]
            out["lr"][name] = {"exit": r["exit"], "first_nonfinite_step": r["first_nonfinite_step"],
                               "skipped": r["skipped"], "last_step": r["steps"][-1]["step"] if r["steps"] else 0,
                               "mean_loss_71_80": mean_loss(r["steps"], 71, 80), "max_finite_loss": max(finite, default=None),
                               "max_grad_norm": max((float(s["grad_norm"]) for s in r["steps"]), default=None),
                               "message": [line for line in r["log"].splitlines() if "non-finite" in line or "halt" in line][-3:]}
    if "determinism" in res:
        runs = res["determinism"]

        def losses(name):
            return [(s["step"], s["loss"], s["grad_norm"]) for s in runs[name]["steps"]]

        out["determinism"] = {
            "deterministic runs bitwise equal": losses("deterministic=true #1") == losses("deterministic=true #2"),
            "default runs bitwise equal": losses("deterministic=false #1") == losses("deterministic=false #2"),
            "deterministic equals default": losses("deterministic=true #1") == losses("deterministic=false #1"),
            "max abs loss difference, default runs": max(abs(a[1] - b[1]) for a, b in zip(
                losses("deterministic=false #1"), losses("deterministic=false #2"))),
            "s_per_step": {n: sum(s["seconds"] for s in r["steps"][3:]) / max(1, len(r["steps"][3:])) for n, r in runs.items()},
        }
    if "resume" in res and "base" in res:
        base = {r["step"]: r["loss"] for r in res["base"]["steps"]}
        out["resume"] = {}
        for name, r in res["resume"].items():
            shift = 0 if name.startswith("resumed") else 100
            steps = {s["step"] + shift: s["loss"] for s in r["steps"] if 100 < s["step"] + shift <= 150}
            out["resume"][name] = {
                "equal to never stopping": (len(steps) == 50 and all(base.get(k) == v for k, v in steps.items()))
                if shift == 0 else None,
                "exit": r["exit"],
                "loss, steps 101-105": [round(steps[k], 3) for k in range(101, 106) if k in steps],
                "mean loss 101-110": sum(steps[k] for k in range(101, 111) if k in steps) / 10,
                "mean loss 141-150": sum(steps[k] for k in range(141, 151) if k in steps) / 10,
            }
        out["resume"]["never stopped"] = {"loss, steps 101-105": [round(base[k], 3) for k in range(101, 106)],
                                          "mean loss 101-110": sum(base[k] for k in range(101, 111)) / 10,
                                          "mean loss 141-150": sum(base[k] for k in range(141, 151)) / 10}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default=str(REPO / "outputs" / "lm_experiments"))
    p.add_argument("--only", action="append", default=[], choices=["base", "lr", "determinism", "resume"])
    args = p.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    saved = root / "results.json"
    res = json.loads(saved.read_text()) if saved.exists() else {}
    todo = args.only or ["base", "lr", "determinism", "resume"]
    for name in todo:
        print(f"{name}:", file=sys.stderr, flush=True)
        if name == "base":
            res["base"] = exp_base(root, args.steps)
        elif name == "lr":
            res["lr"] = exp_lr(root, args.steps)
        elif name == "determinism":
            res["determinism"] = exp_determinism(root, args.steps)
        else:
            res["resume"] = exp_resume(root, args.steps, res["base"])
        saved.write_text(json.dumps(res))
    figures(res, root)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    sys.path.insert(0, str(REPO))
    from pipeline.accel import describe_cpu

    result = {"commit": commit, "machine": describe_cpu(), "steps": args.steps, **summary(res)}
    RESULTS.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
