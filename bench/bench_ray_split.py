"""The split stage on Ray: what its driver holds per document, before and after split's rows were routed
by tasks (ray_split.py). The whole prepare's peak RSS (bench_ray.py --prepare-only) moves by tens of
bytes per document here, within its noise; this measures the stage itself.

    nice -n 5 python bench/bench_ray_split.py [--sizes 100000,300000] [--before REV] [--workers 1]

Per corpus size, code (this checkout, and commit REV's tree from `git archive`) and assignment (hash,
stratified), one process each: a local Ray, a synthetic corpus on disk (ids, short texts, 3 classes of
50/25/25%), then split.split with the leakage check off. Measured around the stage only: the bytes the
driver receives from engine.get (pickled size of each answer), the peak of the driver's Python and numpy
allocations (tracemalloc), the Arrow memory the driver still holds after it (a select's indices live
there), its RSS growth, the stage's seconds and its CPU-seconds (the driver's; with Ray's processes).
The slope between the smallest and the largest size is the growth per document.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench_ray import REPO, checkout  # noqa: E402  (its folder is sys.path[0]: this script's)


def corpus(n: int, path: Path) -> None:
    from datasets import Dataset

    labels = ["a", "a", "b", "c"]
    texts = [f"document {k} says {k % 977}" for k in range(n)]
    Dataset.from_dict({"id": [f"s{k:08d}" for k in range(n)], "text": texts,
                       "label": [labels[k % 4] for k in range(n)], "source_split": [""] * n}).save_to_disk(str(path))


def tree_cpu(me) -> float:
    """CPU-seconds (user + system) used so far by this process and its descendants (Ray's raylet and workers)."""
    import psutil

    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def child(job: dict) -> dict:
    sys.path.insert(0, job["repo"])
    import psutil
    import pyarrow as pa
    from datasets import load_from_disk

    from pipeline.config import RayConfig, SplitConfig
    from pipeline.data.engines.ray import engine as engine_ray
    from pipeline.data.stages import split
    from pipeline.data.engines.base import StageContext

    engine_ray.start_local(RayConfig(num_cpus=job["workers"]))
    engine = engine_ray.RayEngine.connect(RayConfig())
    received, get = [0], engine.get

    def counted(refs, what):
        out = get(refs, what)
        received[0] += len(pickle.dumps(out))
        return out

    engine.get = counted
    ds, out, me = load_from_disk(job["data"]), Path(job["out"]), psutil.Process()
    rss, arrow, cpu, t0 = me.memory_info().rss, pa.total_allocated_bytes(), me.cpu_times(), time.perf_counter()
    tree = tree_cpu(me)
    tracemalloc.start()
    with engine.stage(out / "stage"):
        parts = split.split(ds, SplitConfig(leakage="off", stratify=job["stratify"]),
                            StageContext(out_dir=out, engine=engine, progress=False)).data
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        held = pa.total_allocated_bytes() - arrow
        done, tree = me.cpu_times(), tree_cpu(me) - tree
    return {"docs": sum(parts[s].num_rows for s in parts), "seconds": time.perf_counter() - t0,
            "driver_cpu_s": done.user + done.system - cpu.user - cpu.system, "tree_cpu_s": tree,
            "received": received[0],
            "traced_peak": peak, "arrow_held": held, "rss_growth": me.memory_info().rss - rss,
            "load": os.getloadavg()[0]}


def table(rows: list[dict]) -> str:
    lines = ["| code | split | docs | received B | received B/doc (slope) | traced peak MiB | traced B/doc (slope) | "
             "Arrow held B/doc (slope) | RSS growth MiB | stage s | driver CPU-s | tree CPU-s | load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in dict.fromkeys((r["code"], r["how"]) for r in rows):
        pts = sorted((r for r in rows if (r["code"], r["how"]) == key), key=lambda r: r["docs"])
        a, b = pts[0], pts[-1]
        slope = {k: (b[k] - a[k]) / (b["docs"] - a["docs"]) if len(pts) > 1 else 0
                 for k in ("received", "traced_peak", "arrow_held")}
        for r in pts:
            lines.append(f"| {key[0]} | {key[1]} | {r['docs']:,} | {r['received']:,} | {slope['received']:.2f} | "
                         f"{r['traced_peak'] / 2**20:,.1f} | {slope['traced_peak']:.1f} | {slope['arrow_held']:.1f} | "
                         f"{r['rss_growth'] / 2**20:,.0f} | {r['seconds']:.1f} | {r['driver_cpu_s']:.1f} | "
                         f"{r['tree_cpu_s']:.1f} | "
                         f"{r['load']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000", help="corpus sizes, comma-separated")
    parser.add_argument("--before", default="", metavar="REV", help="also measure commit REV's code")
    parser.add_argument("--workers", type=int, default=1, help="CPUs of the local Ray")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_ray_split_"))
    codes = [("this checkout", str(REPO))] + ([(args.before, checkout(args.before, tmp))] if args.before else [])
    rows = []
    for n in sorted(int(s) for s in args.sizes.split(",")):
        corpus(n, tmp / f"corpus-{n}")
        for how in ("hash", "stratified"):
            for code, repo in codes:
                job = {"repo": repo, "data": str(tmp / f"corpus-{n}"), "out": str(tmp / f"out-{len(rows)}"),
                       "workers": args.workers, "stratify": how == "stratified"}
                done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True,
                                      text=True)
                if done.returncode:
                    sys.exit(f"{code} {how} {n} failed:\n{done.stderr[-3000:]}")
                rows.append({"code": code, "how": how, **json.loads(done.stdout.strip().splitlines()[-1])})
                print(f"  {code} {how} {n}: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
    print(table(rows))


if __name__ == "__main__":
    main()
