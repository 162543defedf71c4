"""The local engine against the Ray engine on 1 and 2 workers: docs/s of dedup and of the whole prepare.

    python bench/bench_ray.py [--synthetic 1000000] [--prepare-synthetic 200000] [--out bench/ray.json]

Corpora: the embedded tweets (38k rows, the default config) and a synthetic corpus of short
documents (12-24 words from a 5,000-word vocabulary; 10% near duplicates with one word changed, 5%
exact copies in other case and spacing). Every Ray run checks that its clusters.jsonl equals the
local engine's byte for byte. Ray's start-up is timed separately and not in docs/s. Peak memory:
the driver's max RSS (getrusage) and the largest summed RSS of the Ray worker processes, sampled
every 50 ms. Per-document costs (CPU-seconds in each dedup task, bytes shuffled) feed the on-paper
estimate for 1 B documents in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import DedupConfig, RayConfig, load_config  # noqa: E402
from pipeline.data import engine_ray, runner  # noqa: E402
from pipeline.data.common import StageContext  # noqa: E402
from pipeline.data.dedup import REPORT, dedup  # noqa: E402


class WorkerMemory:
    """Peak summed RSS of the processes whose command line names a Ray worker (ray::...)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if cmd.startswith("ray::") and p.info["memory_info"] is not None:
                    total += p.info["memory_info"].rss
            self.peak = max(self.peak, total)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def synthetic(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    vocab = [f"w{k}" for k in range(5000)]
    texts = []
    for k in range(n):
        r = rng.random()
        if k > 100 and r < 0.10:  # a near duplicate of an earlier text: one word changed
            words = texts[rng.randrange(k)].split()
            words[rng.randrange(len(words))] = rng.choice(vocab)
            texts.append(" ".join(words))
        elif k > 100 and r < 0.15:  # an exact copy in other case and spacing
            texts.append("  " + texts[rng.randrange(k)].upper())
        else:
            texts.append(" ".join(rng.choices(vocab, k=rng.randint(12, 24))))
    return texts, [f"s{k:08d}" for k in range(n)]


def tweets() -> tuple[list[str], list[str]]:
    """The embedded corpus as the dedup stage sees it: the default config's clean stage output."""
    out = Path(tempfile.mkdtemp(prefix="bench_ray_"))
    cfg = load_config(None, [f"output_dir={out}"])
    runner.run(cfg, progress=False)
    clean_dir = next(p for p in (cfg.data_dir / "stages").iterdir() if p.name.startswith("1-clean"))
    ds = runner.load_stage(clean_dir, "clean")
    return ds["text"][:], ds["id"][:]


def _dataset(texts, ids):
    from datasets import Dataset

    return Dataset.from_dict({"id": ids, "text": texts, "label": [""] * len(texts), "source_split": [""] * len(texts)})


def time_dedup(texts, ids, engine, out: Path) -> tuple[float, bytes, dict]:
    out.mkdir(parents=True)
    ds = _dataset(texts, ids)
    t0 = time.perf_counter()
    result = dedup(ds, DedupConfig(), StageContext(out_dir=out, engine=engine))
    return time.perf_counter() - t0, (out / REPORT).read_bytes(), result.stats


def time_prepare(overrides: list[str], engine: str, out: Path) -> tuple[float, int]:
    cfg = load_config(None, [f"output_dir={out}", f"prepare.engine={engine}", *overrides])
    t0 = time.perf_counter()
    rows = runner.run(cfg, force=True, progress=False)
    return time.perf_counter() - t0, rows[0]["rows_out"]


def write_csv(texts: list[str], path: Path) -> list[str]:
    labels = ["neg", "pos", "neutral"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "sentiment"])
        for k, t in enumerate(texts):
            w.writerow([t, labels[k % 3]])
    return ["source.format=csv", "source.package=", f"source.path={path}", "source.encoding=utf-8",
            "source.label_field=sentiment", "label.names=[neg, neutral, pos]"]


def run(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench_ray_"))
    corpora = {"tweets (embedded)": tweets(), f"synthetic {args.synthetic:,}": synthetic(args.synthetic)}
    big_csv = write_csv(synthetic(args.prepare_synthetic, seed=1)[0], tmp / "synthetic.csv")
    prepares = {"tweets (embedded)": [], f"synthetic {args.prepare_synthetic:,}": big_csv}
    results = {"dedup": {}, "prepare": {}, "memory": {}, "costs": {}}
    reference = {}
    for name, (texts, ids) in corpora.items():  # the local engine first: the reference bytes
        secs, report, stats = time_dedup(texts, ids, None, tmp / f"local-{len(texts)}")
        reference[name] = report
        results["dedup"][(name, "local")] = len(texts) / secs
        results["costs"][name] = {"docs": len(texts), "verified_pairs": stats["verified_pairs"],
                                  "candidate_pairs": stats["candidate_pairs"], "bands": stats["lsh_bands"]}
    for name, overrides in prepares.items():
        secs, rows = time_prepare(overrides, "local", tmp / f"prep-local-{len(name)}")
        results["prepare"][(name, "local")] = rows / secs
    results["memory"]["local driver max RSS MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for workers in (1, 2):
        t0 = time.perf_counter()
        engine_ray.start_local(RayConfig(num_cpus=workers))
        results["memory"][f"ray start-up s ({workers} worker)"] = time.perf_counter() - t0
        engine = engine_ray.RayEngine.connect(RayConfig())
        with WorkerMemory() as mem:
            for name, (texts, ids) in corpora.items():
                secs, report, _ = time_dedup(texts, ids, engine, tmp / f"ray{workers}-{len(texts)}")
                assert report == reference[name], f"{name}: Ray's clusters.jsonl differs from the local engine's"
                results["dedup"][(name, f"ray {workers}")] = len(texts) / secs
            for name, overrides in prepares.items():
                secs, rows = time_prepare(overrides, "ray", tmp / f"prep-ray{workers}-{len(name)}")
                results["prepare"][(name, f"ray {workers}")] = rows / secs
        results["memory"][f"ray {workers} workers peak summed RSS MiB"] = mem.peak / 2**20
        import ray

        ray.shutdown()
    results["memory"]["driver max RSS MiB (whole run)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def table(results: dict) -> str:
    lines = ["| what | corpus | local | Ray, 1 worker | Ray, 2 workers |", "|---|---|---:|---:|---:|"]
    for what in ("dedup", "prepare"):
        names = dict.fromkeys(name for name, _ in results[what])
        for name in names:
            cells = [f"{results[what].get((name, e), float('nan')):,.0f}" for e in ("local", "ray 1", "ray 2")]
            lines.append(f"| {what} docs/s | {name} | " + " | ".join(cells) + " |")
    lines += ["", "| memory and start-up | value |", "|---|---:|"]
    lines += [f"| {k} | {v:,.1f} |" for k, v in results["memory"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", type=int, default=1_000_000, help="documents of the synthetic dedup corpus")
    parser.add_argument("--prepare-synthetic", type=int, default=200_000, help="documents of the synthetic prepare")
    parser.add_argument("--out", default="", help="also write the results as JSON here")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    results = run(args)
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, flags {' '.join(simd)}")
    print(table(results))
    print(json.dumps(results["costs"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({k: {str(kk): vv for kk, vv in v.items()} for k, v in results.items()},
                                             indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
