"""Resident memory of a long training run: does it grow with the steps?

    python bench/bench_memory.py [--steps 600] [--max-length 256] [--batch 8] [--rows 1600]

Trains the packaged MiniLM with `pipeline/train.py` as a real process on tweets joined into long
documents (lengths vary from batch to batch, as on a long-review corpus) and samples the process's
RSS every half second, for each variant of the allocator settings, one after the other. Prints RSS
(MiB) at every tenth of the run and the growth from the first tenth to the end: a leak grows
linearly with the steps; glibc arena fragmentation from varying batch shapes grows and then
plateaus, and goes with MALLOC_ARENA_MAX / MALLOC_TRIM_THRESHOLD_.
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

VARIANTS = {  # name -> environment additions
    "glibc default": {},
    "MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
    "MALLOC_ARENA_MAX=2, MALLOC_TRIM_THRESHOLD_=128 MiB": {"MALLOC_ARENA_MAX": "2",
                                                           "MALLOC_TRIM_THRESHOLD_": str(128 << 20)},
}


def run(config: Path, steps: int, batch: int, env_extra: dict) -> list[tuple[int, float]]:
    """(step, RSS MiB) samples of one training process."""
    import psutil

    out = config.parent / "out" / "run"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = [sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(config), f"train.max_steps={steps}",
           f"train.batch_size={batch}", "train.log_every=1", "train.eval_every=0", "train.save_every=0",
           "train.save_at_epoch_end=false", "train.epochs=100"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples, ps = [], psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss / 2**20
        except psutil.Error:
            break
        log = out / "metrics.jsonl"
        step = 0
        if log.is_file():
            lines = log.read_text().splitlines()
            for line in reversed(lines):
                try:
                    step = json.loads(line).get("step", 0)
                    break
                except json.JSONDecodeError:
                    continue
        samples.append((step, rss))
        time.sleep(0.5)
    if proc.returncode != 0:
        raise SystemExit(f"training exited with {proc.returncode}: {' '.join(cmd)}")
    return samples


def tenths(samples: list[tuple[int, float]], steps: int) -> list[float]:
    """RSS when each tenth of the run's steps was reached (the first sample at or past it)."""
    out = []
    for k in range(1, 11):
        later = [rss for step, rss in samples if step >= k * steps // 10]
        out.append(later[0] if later else samples[-1][1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rows", type=int, default=1600, help="long documents (each ~24 tweets)")
    p.add_argument("--only", action="append", default=[], help="run only variants whose name starts with this")
    args = p.parse_args()
    from bench_train import build_data

    with tempfile.TemporaryDirectory() as tmp:
        config = build_data(Path(tmp), args.rows * 24, args.max_length, long=True)
        print(f"MiniLM, max_length {args.max_length}, batch {args.batch}, {args.steps} steps, lengths varying per batch\n")
        print("| allocator | RSS MiB at 10% ... 100% of the steps | growth 10% -> 100% |")
        print("|---|---|---:|")
        for name, extra in VARIANTS.items():
            if args.only and not any(name.startswith(o) for o in args.only):
                continue
            t = tenths(run(config, args.steps, args.batch, extra), args.steps)
            print(f"| {name} | {' '.join(f'{x:.0f}' for x in t)} | {t[-1] - t[0]:+.0f} |", flush=True)


if __name__ == "__main__":
    main()
