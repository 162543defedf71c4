"""Resident memory of a long training run: does it grow with the steps?

    python bench/bench_memory.py [--steps 600] [--max-length 256] [--batch 8] [--rows 1600] [--small] [--trace]

Trains the packaged MiniLM with `pipeline/train.py` as a real process on tweets joined into long
documents (lengths vary from batch to batch, as on a long-review corpus) and samples the process's
RSS every half second, for each variant of the allocator settings, all side by side (so the shared
CPU's drift falls on all alike). Prints the median and the highest RSS (MiB) in every tenth of the run, their growth from
the first tenth to the last, and the median seconds per step: a leak grows linearly with the steps;
heap fragmentation from varying batch shapes (glibc's dynamic mmap threshold) goes away when the
heap's free pages are handed back (pipeline/training/memory.py; train.release_memory_every) or with the
threshold fixed (MALLOC_MMAP_THRESHOLD_).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_train import build_data  # noqa: E402  (the documents of 1-24 tweets, prepared as prepare writes them)

VARIANTS = {  # name -> (environment additions, train.py overrides)
    "glibc, nothing released": ({}, ["train.release_memory_every=0"]),
    "glibc, free pages released every 10 steps (the default)": ({}, []),
    "glibc, free pages released every step": ({}, ["train.release_memory_every=1"]),
    "glibc, mmap threshold fixed at 1 MiB": ({"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, ["train.release_memory_every=0"]),
}


SMALL = ["model.from_scratch=bert", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
         "model.intermediate_size=256"]  # fast enough for thousands of steps; the shapes vary as much


def last_step(log: Path) -> int:
    """The newest step in a run's metrics.jsonl (0 before the first record; a torn last line is skipped)."""
    lines = log.read_text().splitlines() if log.is_file() else []
    for line in reversed(lines):
        try:
            return json.loads(line).get("step", 0)
        except json.JSONDecodeError:
            continue
    return 0


def run_side_by_side(config: Path, variants: dict, steps: int, batch: int, extra: list[str], trace) -> dict:
    """Train once per variant, all at the same time (the shared CPU's drift falls on all alike), each in its
    own output folder; sample each process's RSS every half second. Returns name -> ([(step, MiB)], s/step)."""
    import psutil

    procs = {}
    for k, (name, (env_extra, overrides)) in enumerate(variants.items()):
        out = config.parent / f"variant{k}"
        cmd = [sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(config), f"output_dir={out}",
               f"train.max_steps={steps}", f"train.batch_size={batch}", "train.log_every=1", "train.eval_every=0",
               "train.save_every=0", "train.save_at_epoch_end=false", "train.epochs=100",
               "train.group_by_length=false", *extra, *overrides]
        (out / "data").parent.mkdir(parents=True, exist_ok=True)
        (out / "data").symlink_to(config.parent / "data")  # the one prepared copy
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs[name] = (proc, psutil.Process(proc.pid), out / "run" / "metrics.jsonl", [])
    while any(p.poll() is None for p, *_ in procs.values()):
        for name, (proc, ps, log, samples) in procs.items():
            if proc.poll() is None:
                try:
                    samples.append((last_step(log), ps.memory_info().rss / 2**20))
                except psutil.Error:
                    continue
                if trace is not None and len(samples) % 20 == 0:
                    print(f"  {name}: step {samples[-1][0]} {samples[-1][1]:.0f} MiB", file=trace, flush=True)
        time.sleep(0.5)
    result = {}
    for name, (proc, _, log, samples) in procs.items():
        if proc.returncode != 0:
            raise SystemExit(f"{name}: training exited with {proc.returncode}\n{proc.stderr.read()[-2000:]}")
        recs = [json.loads(x) for x in log.read_text().splitlines() if '"seconds"' in x]
        secs = sorted(r["seconds"] / r.get("steps", 1) for r in recs)
        result[name] = (samples, secs[len(secs) // 2])
    return result


def tenths(samples: list[tuple[int, float]], steps: int, pick) -> list[float]:
    """`pick` (median or max) of the RSS samples taken during each tenth of the run's steps, start-up
    (before the first step) left out. A sample lands anywhere within a step, live activations included:
    the median of a tenth is what the process typically holds, the highest its peak."""
    out = []
    for k in range(10):
        inside = [rss for step, rss in samples if max(1, k * steps // 10) <= step < (k + 1) * steps // 10]
        out.append(pick(inside) if inside else float("nan"))
    return out


def table(res: dict, steps: int) -> str:
    import statistics

    lines = ["| allocator | median RSS MiB in each tenth of the steps | growth | highest in each tenth | growth | median s/step |",
             "|---|---|---:|---|---:|---:|"]
    for name, r in res.items():
        mid, hi = tenths(r["samples"], steps, statistics.median), tenths(r["samples"], steps, max)
        lines.append(f"| {name} | {' '.join(f'{x:.0f}' for x in mid)} | {mid[-1] - mid[0]:+.0f} | "
                     f"{' '.join(f'{x:.0f}' for x in hi)} | {hi[-1] - hi[0]:+.0f} | {r['s_per_step']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rows", type=int, default=1600, help="documents (each 1-24 tweets)")
    p.add_argument("--small", action="store_true", help="a small from-scratch BERT (hidden 64, 2 layers) instead of MiniLM")
    p.add_argument("--trace", action="store_true", help="print (step, RSS MiB) every 10 s to stderr while running")
    p.add_argument("--samples", help="also write every (step, RSS MiB) sample of each variant to this JSON file")
    p.add_argument("--only", action="append", default=[], help="run only variants whose name starts with this")
    p.add_argument("--reprint", help="print the table of a --samples file again (nothing is run)")
    args = p.parse_args()
    if args.reprint:
        saved = json.loads(Path(args.reprint).read_text())
        return print(table(saved["variants"], saved["steps"]))
    with tempfile.TemporaryDirectory() as tmp:
        config = build_data(Path(tmp), args.rows * 12, args.max_length, long=True)
        model = "small BERT (hidden 64, 2 layers)" if args.small else "MiniLM"
        print(f"{model}, max_length {args.max_length}, batch {args.batch}, {args.steps} steps, lengths varying per batch\n")
        variants = {k: v for k, v in VARIANTS.items() if not args.only or any(k.startswith(o) for o in args.only)}
        res = run_side_by_side(config, variants, args.steps, args.batch, SMALL if args.small else [],
                               sys.stderr if args.trace else None)
        res = {k: {"samples": v[0], "s_per_step": v[1]} for k, v in res.items()}
        if args.samples:
            Path(args.samples).write_text(json.dumps({"steps": args.steps, "variants": res}))
        print(table(res, args.steps))

if __name__ == "__main__":
    main()
