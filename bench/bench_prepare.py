"""Cached rerun of prepare vs its first run, on the embedded default (real processes, as a user runs it).

    python bench/bench_prepare.py [--runs 2]

Prints a markdown table: first run (every stage computed), a rerun with nothing changed (every
stage cached), and a rerun after changing one split setting (split, label, tokenize recomputed).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_prepare(out: Path, *overrides: str) -> float:
    cmd = [sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--quiet", f"output_dir={out}", *overrides]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2, help="repetitions; the median is reported")
    args = parser.parse_args()
    first, cached, one_change = [], [], []
    for k in range(args.runs):
        out = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
        try:
            first.append(run_prepare(out))
            cached.append(run_prepare(out))
            one_change.append(run_prepare(out, f"split.seed={100 + k}"))
        finally:
            shutil.rmtree(out, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    f = med(first)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}\n")
    print("| run of `python pipeline/prepare.py` (default config, 38,158 tweets) | seconds | vs first run |")
    print("|---|---:|---:|")
    print(f"| first run, every stage computed | {f:.2f} | 100% |")
    print(f"| rerun, nothing changed (every stage cached) | {med(cached):.2f} | {100 * med(cached) / f:.1f}% |")
    print(f"| rerun after `split.seed=...` (split, label, tokenize recomputed) | {med(one_change):.2f} | {100 * med(one_change) / f:.1f}% |")


if __name__ == "__main__":
    main()
