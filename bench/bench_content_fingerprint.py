"""What identifying the data by its content costs: prepare on the embedded default at another commit
(before content fingerprints) and at this checkout, alternated, fresh output folders, real processes;
then each stage's content_fingerprint timed alone against the bytes of its data.

    python bench/bench_content_fingerprint.py [--before 13532df] [--runs 3] [--config configs/default.yaml]

The other commit runs from a git worktree with its own directory first on PYTHONPATH (so its own
`pipeline` package is imported). Prints two markdown tables and the CPU flags that matter here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def prepare(tree: Path, out: Path, config: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / "pipeline" / "prepare.py"), "--quiet", "--config", config, f"output_dir={out}"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tree, env=env)
    return time.perf_counter() - start


def stage_costs(out: Path) -> list[tuple[str, float, float]]:
    """(stage folder, MiB of its data/, seconds of content_fingerprint) for each stage, in order."""
    from pipeline.data.content import content_fingerprint

    rows = []
    folders = sorted((out / "data" / "stages").iterdir(), key=lambda p: int(p.name.split("-")[0]))
    content_fingerprint(folders[0])  # untimed: the first call imports datasets
    for folder in sorted((out / "data" / "stages").iterdir(), key=lambda p: int(p.name.split("-")[0])):
        size = sum(p.stat().st_size for p in (folder / "data").rglob("*") if p.is_file()) / 2**20
        start = time.perf_counter()
        content_fingerprint(folder)
        rows.append((folder.name.rsplit("-", 1)[0], size, time.perf_counter() - start))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="13532df", help="commit without content fingerprints")
    parser.add_argument("--runs", type=int, default=3, help="runs of each; the median is reported")
    parser.add_argument("--config", default="configs/default.yaml")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_content_"))
    before = scratch / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times: dict[str, list[float]] = {"before": [], "now": []}
    try:
        for k in range(args.runs):
            order = [("before", before), ("now", ROOT)] if k % 2 == 0 else [("now", ROOT), ("before", before)]
            for name, tree in order:  # alternated: a loaded machine's drift falls on both
                times[name].append(prepare(tree, scratch / f"{name}-{k}", args.config))
        costs = stage_costs(scratch / "now-0")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    b, n = statistics.median(times["before"]), statistics.median(times["now"])
    from pipeline.accel import describe_cpu  # this checkout's (ROOT is first on sys.path)

    print(f"machine: {describe_cpu()}; {args.config}, "
          f"median of {args.runs}\n")
    print("| prepare, first run | seconds | ratio |\n|---|---|---|")
    print(f"| {args.before} (no content fingerprint) | {b:.2f} | 1.00 |")
    print(f"| this checkout | {n:.2f} | {n / b:.2f} |\n")
    print("| stage | data MiB | content_fingerprint s | MiB/s |\n|---|---|---|---|")
    for stage, size, seconds in costs:
        print(f"| {stage} | {size:.1f} | {seconds:.3f} | {size / max(seconds, 1e-9):.0f} |")
    print(f"\nscratch: {scratch} (delete it when done)")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
