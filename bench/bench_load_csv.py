"""The load stage alone on Ray, a quoted CSV of short rows: docs/s of this checkout (the file read in
parts cut at record starts by quote parity) against commit --before (a CSV holding a quote read by
one task), each measurement its own process, the two alternated --repeats times.

    nice -n 10 python bench/bench_load_csv.py [--rows 300000] [--before 50f13be] [--workers 1]
                                             [--blocks 0] [--repeats 3]

The CSV: bench_ray.synthetic's short texts (12-24 words), every field quoted, every 50th text with
a doubled quote and every 70th with a line break inside its quotes, a label column. Ray's start-up
and a warm-up load of a 10-row CSV (so the worker processes exist) are not timed; docs/s is rows
read over the wall time of load.load (reading, finishing the rows, ids, writing the shards); CPU-s
is the CPU time the driver and Ray's processes (workers, raylet, GCS) used meanwhile, the steadier
figure on a loaded machine.
Each run's ids are hashed: the two codes must give the same rows.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_ray import REPO, TreeMemory, checkout, synthetic


def write_quoted_csv(n: int, path: Path) -> Path:
    texts = synthetic(n)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["text", "label"])
        for k, t in enumerate(texts):
            t = t + (' said "so"' if k % 50 == 0 else "") + ("\nsecond line" if k % 70 == 0 else "")
            w.writerow([t, ["neg", "pos"][k % 2]])
    return path


def child(job: dict) -> dict:
    sys.path.insert(0, job["repo"])
    from pipeline.config import RayConfig, SourceConfig
    from pipeline.data.engines.ray import engine as engine_ray
    from pipeline.data.stages import load
    from pipeline.data.engines.base import StageContext

    engine_ray.start_local(RayConfig(num_cpus=job["workers"]))
    engine = engine_ray.RayEngine.connect(RayConfig(blocks=job["blocks"]))
    out = Path(job["out"])

    def load(path: str, name: str):
        folder = out / name
        folder.mkdir(parents=True)
        with engine.stage(folder):
            return load.load(None, SourceConfig(format="csv", path=path), StageContext(out_dir=folder, engine=engine))

    load(job["warmup"], "warmup")
    with TreeMemory() as mem:
        mark, t0 = mem.cpu_mark(), time.perf_counter()
        result = load(job["csv"], "timed")
        seconds, cpu = time.perf_counter() - t0, mem.cpu_since(mark)
    ids = hashlib.sha1("\n".join(result.data["id"]).encode()).hexdigest()[:12]
    return {"docs": result.stats["rows_read"], "seconds": seconds, "cpu_s": cpu, "ids": ids, "load": os.getloadavg()[0]}


def measure(job: dict, nice: int) -> dict:
    cmd = ["nice", "-n", str(nice), sys.executable, __file__, "--child", json.dumps(job)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{job['code']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--before", default="50f13be", help="the commit to compare with")
    parser.add_argument("--workers", type=int, default=1, help="CPUs of the local Ray")
    parser.add_argument("--blocks", type=int, default=0, help="ray.blocks (0: 4 per CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child-nice", type=int, default=10)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-load-csv-") as tmp:
        tmp = Path(tmp)
        big, small = write_quoted_csv(args.rows, tmp / "quoted.csv"), write_quoted_csv(10, tmp / "warmup.csv")
        codes = {"this checkout": str(REPO), args.before: checkout(args.before, tmp)}
        runs: dict[str, list] = {code: [] for code in codes}
        for r in range(args.repeats):
            for code, repo in codes.items():
                job = {"code": code, "repo": repo, "csv": str(big), "warmup": str(small), "workers": args.workers,
                       "blocks": args.blocks, "out": str(tmp / f"out-{len(runs[code])}-{code.replace(' ', '_')}")}
                runs[code].append(measure(job, args.child_nice))
                print(f"  {code} run {r + 1}: {runs[code][-1]}", file=sys.stderr)
        assert len({x["ids"] for rs in runs.values() for x in rs}) == 1, "the two codes loaded different rows"
        print(f"quoted CSV, {args.rows:,} rows ({big.stat().st_size / 2**20:.1f} MiB), Ray {args.workers} worker(s), "
              f"ray.blocks={args.blocks or '4 per CPU'}; median of {args.repeats} runs each, alternated\n")
        print("| code | load stage docs/s | seconds (runs) | CPU-s (runs) | load avg during runs |\n"
              "|---|---:|---|---|---|")
        for code, rs in runs.items():
            secs, cpus, loads = ([x[k] for x in rs] for k in ("seconds", "cpu_s", "load"))
            print(f"| {code} | {args.rows / statistics.median(secs):,.0f} | {', '.join(f'{s:.2f}' for s in secs)} | "
                  f"{', '.join(f'{c:.2f}' for c in cpus)} | {', '.join(f'{a:.1f}' for a in loads)} |")


if __name__ == "__main__":
    main()
