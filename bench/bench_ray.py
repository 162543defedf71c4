"""The local engine against the Ray engine on 1 and 2 workers: docs/s of dedup and of the whole
prepare, peak memory of the driver and of the workers, at several corpus sizes.

    nice -n 10 python bench/bench_ray.py [--sizes 100000,300000,1000000] [--prepare-synthetic 100000]
                                         [--prepare-only | --dedup-only] [--before REV]
                                         [--set KEY=VALUE ...] [--workers 0,1,2] [--out bench/ray.json]

--before REV also runs every synthetic dedup and every prepare with commit REV's code (its tree from
`git archive`, each measurement its own process) and prints a before/after table of docs/s and the
driver's peak RSS (and its anonymous part: the RSS less the pages of the memory-mapped Arrow files,
which the kernel can drop), with its growth per document. Every prepare also counts the bytes each
stage wrote (the process tree's write() bytes while the stage ran: its rows, scratch files and stage
folder) and prints them per stage beside the prepare's docs/s.

Corpora: the embedded tweets (the default config's clean-stage output, 38k rows) and prefixes of one
synthetic corpus of short documents (12-24 words from a 5,000-word vocabulary; 10% near duplicates
with one word changed, 5% exact copies in other case and spacing). Each measurement is its own
process (`--child`), so that its peak memory is its own: a sampler thread reads, every 0.1 s, the
RSS of the driver and the summed RSS of its descendants (Ray's raylet, GCS and workers; the `ray::`
workers also apart), and every 0.5 s the PSS of the whole process tree (shared pages, such as the
object store's, counted once: the figure that must fit the machine). Ray's start-up is timed apart
and is not in docs/s. Every Ray run's clusters.jsonl is checked equal, byte for byte, to the local
engine's. From the synthetic sizes it fits peak PSS = a + b * docs per engine and extrapolates the
largest corpus that fits 24 GiB; and it prints the bytes the Ray dedup's shuffle moved.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ENGINES = (("local", 0), ("ray", 1), ("ray", 2))
GIB = 2**30


def _anon_rss() -> int:
    """This process's anonymous resident bytes (heap, Ray's in-process object store): its RSS less the
    pages of files it maps (the stage's memory-mapped Arrow files, which the kernel can drop)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), 0)


class TreeMemory:
    """Peaks of the driver's RSS, its descendants' summed RSS (and of those named ray::...) and the
    whole tree's summed PSS, sampled in a thread while the `with` block runs; and the CPU seconds
    (user + system) each process of the tree has used, so that a stretch's CPU time is known."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()
        self.peak = dict.fromkeys(("driver_rss", "driver_anon", "children_rss", "workers_rss", "tree_pss"), 0)
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds it had used at the last sample
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, k: int) -> None:
        import psutil

        rss = {"driver_rss": self.me.memory_info().rss, "driver_anon": _anon_rss(), "children_rss": 0, "workers_rss": 0}
        procs = self.me.children(recursive=True)
        for p in [self.me, *procs]:
            try:
                t = p.cpu_times()
                with self._lock:
                    self.cpu[p.pid] = max(self.cpu.get(p.pid, 0.0), t.user + t.system)
            except psutil.Error:
                pass
        for p in procs:
            try:
                m = p.memory_info().rss
                rss["children_rss"] += m
                rss["workers_rss"] += m if " ".join(p.cmdline()).startswith("ray::") else 0
            except psutil.Error:
                pass
        if k % 5 == 0:
            pss = 0
            for p in [self.me, *procs]:
                try:
                    pss += p.memory_full_info().pss
                except psutil.Error:
                    pass
            rss["tree_pss"] = pss
        for key, v in rss.items():
            self.peak[key] = max(self.peak[key], v)

    def cpu_mark(self) -> dict[int, float]:
        self._sample(1)
        with self._lock:
            return dict(self.cpu)

    def cpu_since(self, mark: dict[int, float]) -> float:
        """CPU seconds the tree used since `mark` (a process gone between two samples loses < 0.1 s)."""
        self._sample(1)
        with self._lock:
            return sum(v - mark.get(pid, 0.0) for pid, v in self.cpu.items())

    def write_mark(self) -> dict[int, int]:
        """Bytes each process of the tree has passed to write() so far (/proc/<pid>/io wchar: files,
        pipes; not mmap'd pages): a stage's own bytes are the growth between two marks (a process that
        exits between them loses its count; Ray's workers live for the whole prepare)."""
        import psutil

        out = {}
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                out[p.pid] = p.io_counters().write_chars
            except psutil.Error:
                pass
        return out

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            self._sample(k)
            k += 1
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample(0)


def synthetic(n: int, seed: int = 0) -> list[str]:
    """n short texts; a prefix of synthetic(m) for m > n is synthetic(n) (each copy looks back only)."""
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
    return texts


def save_corpus(texts: list[str], ids: list[str], path: Path) -> Path:
    from datasets import Dataset

    n = len(texts)
    Dataset.from_dict({"id": ids, "text": texts, "label": [""] * n, "source_split": [""] * n}).save_to_disk(str(path))
    return path


def tweets(tmp: Path) -> Path:
    """The embedded corpus as the dedup stage sees it: the default config's clean stage output."""
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data import runner

    cfg = load_config(None, [f"output_dir={tmp / 'tweets-prep'}", "prepare.engine=local"])
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    clean_dir = next(p for p in (cfg.data_dir / "stages").iterdir() if p.name.startswith("1-clean"))
    ds = runner.load_stage(clean_dir, "clean")
    return save_corpus(ds["text"][:], ds["id"][:], tmp / "corpus-tweets")


def write_csv(texts: list[str], path: Path) -> list[str]:
    labels = ["neg", "pos", "neutral"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "sentiment"])
        for k, t in enumerate(texts):
            w.writerow([t, labels[k % 3]])
    return ["source.format=csv", "source.package=", f"source.path={path}", "source.encoding=utf-8",
            "source.label_field=sentiment", "label.names=[neg, neutral, pos]"]


# ---------------------------------------------------------------- one measurement (a child process)


def child(job: dict) -> dict:
    """Time one dedup or one prepare with one engine; its memory peaks and (Ray) the shuffle's bytes."""
    if job.get("repo"):  # --before: another commit's tree, ahead of this checkout's (measure() runs the child
        sys.path.insert(0, job["repo"])  # in that tree, with it as PYTHONPATH, for Ray's workers)
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.config import DedupConfig, RayConfig
    from pipeline.data import runner
    from pipeline.data.engines.base import StageContext
    from pipeline.data.engines.ray import engine as engine_ray
    from pipeline.data.stages.dedup import dedup

    out, engine, startup, pairs = Path(job["out"]), None, 0.0, {}
    out.mkdir(parents=True)
    with TreeMemory() as mem:
        if job["workers"]:
            t0 = time.perf_counter()
            engine_ray.start_local(RayConfig(num_cpus=job["workers"]))
            startup = time.perf_counter() - t0
            engine = engine_ray.RayEngine.connect(RayConfig())
        mark, t0 = mem.cpu_mark(), time.perf_counter()
        if job["what"] == "dedup":
            from datasets import load_from_disk

            ds = load_from_disk(job["data"])
            stats = dedup(ds, DedupConfig(), StageContext(out_dir=out, engine=engine)).stats
            docs, pairs = ds.num_rows, {k: stats[k] for k in ("candidate_pairs", "verified_pairs")}
        else:
            cfg = load_config(None, [f"output_dir={out}", f"prepare.engine={job['engine']}", *job["overrides"]])
            written = count_writes(runner, mem)
            report = runner.run(cfg, tasks.get(cfg.task), force=True, progress=False)
            docs, pairs = report[0]["rows_out"], {"stage_s": {r["stage"]: r["seconds"] for r in report}}
        secs, cpu = time.perf_counter() - t0, mem.cpu_since(mark)
    traffic = getattr(engine, "traffic", {}) if job["what"] == "dedup" else {}
    return {"docs": docs, "seconds": secs, "cpu_s": cpu, "load": os.getloadavg()[0], "startup_s": startup,
            **mem.peak, "traffic": traffic, **pairs, **({"written": written} if job["what"] == "prepare" else {})}


def count_writes(runner, mem: TreeMemory) -> dict[str, int]:
    """{stage: bytes the process tree wrote while it ran}, filled in as prepare runs each stage (the
    runner's `_run_stage` wrapped: a stage's rows, its folder, its scratch files, its temporaries)."""
    written, real = {}, runner._run_stage

    def counted(stage, *args, **kwargs):
        mark = mem.write_mark()
        try:
            return real(stage, *args, **kwargs)
        finally:
            now = mem.write_mark()
            written[stage.name] = sum(v - mark.get(pid, 0) for pid, v in now.items())

    runner._run_stage = counted
    return written


def measure(job: dict) -> dict:
    cmd = ["nice", "-n", str(job.get("nice", 10)), sys.executable, str(Path(__file__).resolve()), "--child",
           json.dumps(job)]
    code = job.get("repo") or str(REPO)  # the tree whose `pipeline` the child and its Ray workers import (Ray
    # puts the driver's working directory on its workers' path, ahead of PYTHONPATH)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=code, env={**os.environ, "PYTHONPATH": code})
    if done.returncode:
        sys.exit(f"{job['what']} {job['engine']} {job['workers']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args, tmp: Path) -> list[dict]:
    engines = [(e, w) for e, w in ENGINES if str(w) in args.workers.split(",")]
    sizes = sorted(int(s) for s in args.sizes.split(",")) if not args.prepare_only else []
    texts = synthetic(max(sizes, default=0))
    corpora = {"tweets (embedded)": tweets(tmp)} if not (args.prepare_only or args.dedup_only) else {}
    for n in sizes:
        corpora[f"synthetic {n:,}"] = save_corpus(texts[:n], [f"s{k:08d}" for k in range(n)], tmp / f"corpus-{n}")
    del texts
    prepares = {}
    if not args.dedup_only:
        csv_overrides = write_csv(synthetic(args.prepare_synthetic, seed=1), tmp / "synthetic.csv") + (args.set or [])
        prepares = {"tweets (embedded)": args.set or [], f"synthetic {args.prepare_synthetic:,}": csv_overrides}
        if args.prepare_only:
            del prepares["tweets (embedded)"]
    codes = [("this checkout", "")] + ([(args.before, checkout(args.before, tmp))] if args.before else [])
    rows = []
    for name, path in corpora.items():
        reference = None
        for (engine, workers), (code, repo) in ((e, c) for e in engines for c in codes):
            out = tmp / f"dedup-{len(rows)}"
            r = measure({"what": "dedup", "data": str(path), "engine": engine, "workers": workers, "out": str(out),
                         "repo": repo, "nice": args.child_nice})
            report = (out / "clusters.jsonl").read_bytes()
            reference = reference if reference is not None else report
            assert report == reference, f"{name}: {code} {engine}'s clusters.jsonl differs from the local engine's"
            rows.append({"what": "dedup", "corpus": name, "engine": engine, "workers": workers, "code": code, **r})
            print(f"  dedup {name} {engine} {workers} ({code}): {r['docs'] / r['seconds']:,.0f} docs/s, "
                  f"{r['cpu_s']:.1f} CPU-s, driver {r['driver_rss'] / 2**20:,.0f} MiB, load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr)
    runs = [(e, c) for r in range(args.repeat) for e in engines  # every other round in reverse: A B, B A, ...
            for c in (codes if r % 2 == 0 else codes[::-1])]
    for name, overrides in prepares.items():
        for (engine, workers), (code, repo) in runs:
            job = {"what": "prepare", "engine": engine, "workers": workers, "out": str(tmp / f"prep-{len(rows)}"),
                   "nice": args.child_nice, "repo": repo,
                   "overrides": [*overrides, f"ray.num_cpus={workers}"]}
            rows.append({"what": "prepare", "corpus": name, "engine": engine, "workers": workers, "code": code,
                         **measure(job)})
            print(f"  prepare {name} {engine} {workers} ({code}): {rows[-1]['docs'] / rows[-1]['seconds']:,.0f} "
                  f"docs/s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    return rows


def checkout(rev: str, tmp: Path) -> str:
    """The tree of commit `rev` (git archive: no worktree registered), for --before."""
    where = tmp / "before"
    where.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=tar, check=True)
    return str(where)


# ---------------------------------------------------------------- tables


def before_after_table(rows: list[dict]) -> str:
    """--before: per code and engine, the dedup's docs/s and driver peak RSS at each synthetic size, and
    the driver's growth per document (the slope between the smallest and the largest size)."""
    lines = ["| code | engine | docs | docs/s | docs per CPU-s | driver peak RSS MiB | driver B/doc (slope) | "
             "driver peak anon MiB | anon B/doc (slope) | load |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for code, label in dict.fromkeys((r["code"], _label(r)) for r in rows):
        pts = sorted((r for r in rows if (r["code"], _label(r)) == (code, label)), key=lambda r: r["docs"])
        a, b = pts[0], pts[-1]
        slope = {k: (b.get(k, 0) - a.get(k, 0)) / (b["docs"] - a["docs"]) if len(pts) > 1 else 0
                 for k in ("driver_rss", "driver_anon")}
        for r in pts:
            lines.append(f"| {code} | {label} | {r['docs']:,} | {r['docs'] / r['seconds']:,.0f} | "
                         f"{r['docs'] / r['cpu_s']:,.0f} | {r['driver_rss'] / 2**20:,.0f} | {slope['driver_rss']:,.0f} | "
                         f"{r.get('driver_anon', 0) / 2**20:,.0f} | {slope['driver_anon']:,.0f} | {r['load']:.1f} |")
    return "\n".join(lines)


def writes_table(rows: list[dict]) -> str:
    """--before with prepares: per code and engine, the whole prepare's docs/s and the bytes each stage
    wrote (MiB, and bytes per input document)."""
    stages = list(dict.fromkeys(s for r in rows for s in r.get("written", {})))
    lines = ["| code | corpus | engine | docs/s | docs per CPU-s | " + " | ".join(f"{s} MiB (B/doc), s" for s in stages)
             + " | all MiB | load |", "|---|---|---|---:|---:|" + "---:|" * (len(stages) + 2)]
    for r in (r for r in rows if r["what"] == "prepare" and r.get("written")):
        w, n, t = r["written"], r["docs"], r.get("stage_s", {})
        cells = [f"{w[s] / 2**20:,.1f} ({w[s] / n:,.0f}), {t.get(s, 0):.1f}" if s in w else "-" for s in stages]
        lines.append(f"| {r.get('code', 'this checkout')} | {r['corpus']} | {_label(r)} | {n / r['seconds']:,.0f} | "
                     f"{n / r['cpu_s']:,.0f} | " + " | ".join(cells) + f" | {sum(w.values()) / 2**20:,.1f} | "
                     f"{r['load']:.1f} |")
    return "\n".join(lines)


def _label(r: dict) -> str:
    return "local" if r["engine"] == "local" else f"Ray, {r['workers']} worker{'s' * (r['workers'] > 1)}"


def speed_table(rows: list[dict]) -> str:
    """docs per wall-clock second, and per CPU-second of the whole process tree (driver + Ray)."""
    labels = list(dict.fromkeys(_label(r) for r in rows))  # the engines measured, in their order
    lines = ["| what | corpus | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    for what in ("dedup", "prepare"):
        for per, unit in (("seconds", "docs/s"), ("cpu_s", "docs per CPU-s")):
            for name in dict.fromkeys(r["corpus"] for r in rows if r["what"] == what):
                cells = [f"{r['docs'] / r[per]:,.0f}" for r in rows if r["what"] == what and r["corpus"] == name]
                lines.append(f"| {what} {unit} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory_table(rows: list[dict]) -> str:
    lines = ["| what | corpus | engine | driver peak RSS MiB | descendants' peak RSS MiB (ray:: workers) | "
             "tree peak PSS MiB | Ray start s | load (1 min) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['what']} | {r['corpus']} | {_label(r)} | {r['driver_rss'] / 2**20:,.0f} | "
                     f"{r['children_rss'] / 2**20:,.0f} ({r['workers_rss'] / 2**20:,.0f}) | "
                     f"{r['tree_pss'] / 2**20:,.0f} | {r['startup_s']:.1f} | {r['load']:.1f} |")
    return "\n".join(lines)


def fit_table(rows: list[dict], budget: float = 24 * GIB) -> str:
    """Peak tree PSS (and the driver's peak RSS) = a + b * docs, least squares over the synthetic dedup
    sizes; the docs at which the tree's reaches `budget`."""
    import numpy as np

    lines = ["| engine | tree PSS: a MiB + b B/doc | driver RSS: a MiB + b B/doc "
             "| largest dedup in 24 GiB (extrapolated) |",
             "|---|---:|---:|---:|"]
    for engine, workers in ENGINES:
        pts = [r for r in rows if r["what"] == "dedup" and r["corpus"].startswith("synthetic")
               and (r["engine"], r["workers"]) == (engine, workers)]
        if len(pts) < 2:
            continue
        docs = [r["docs"] for r in pts]
        b, a = np.polyfit(docs, [r["tree_pss"] for r in pts], 1)
        bd, ad = np.polyfit(docs, [r["driver_rss"] for r in pts], 1)
        lines.append(f"| {_label({'engine': engine, 'workers': workers})} | {a / 2**20:,.0f} + {b:,.0f} | "
                     f"{ad / 2**20:,.0f} + {bd:,.0f} | {(budget - a) / b / 1e6:,.1f} M |")
    return "\n".join(lines)


def traffic_table(rows: list[dict]) -> str:
    lines = ["| corpus | workers | band-key triples B/doc | sketch B/doc received by verification | "
             "if each verification task took every block's sketch B/doc | partitions | candidates/doc | CPU/doc |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["traffic"]
        if t:
            n = r["docs"]
            lines.append(f"| {r['corpus']} | {r['workers']} | {t['band_key_bytes'] / n:,.0f} | "
                         f"{t['verify_sketch_bytes'] / n:,.1f} | "
                         f"{t['all_blocks_sketch_bytes'] * t['parts'] / n:,.0f} | "
                         f"{t['parts']} | {r['candidate_pairs'] / n:.3f} | {r['cpu_s'] / n * 1e6:,.1f} us |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000,1000000",
                        help="synthetic dedup corpus sizes, comma-separated")
    parser.add_argument("--prepare-synthetic", type=int, default=100_000, help="documents of the synthetic prepare")
    parser.add_argument("--prepare-only", action="store_true",
                        help="measure only the synthetic prepare (no dedup runs, no tweets)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a config override for the prepares (repeatable), e.g. dedup.method=none")
    parser.add_argument("--dedup-only", action="store_true", help="measure only the synthetic dedups")
    parser.add_argument("--before", default="", metavar="REV",
                        help="also time the synthetic dedups with commit REV's code; print a before/after table")
    parser.add_argument("--child-nice", type=int, default=10,
                        help="niceness added to each measurement's process (under a loaded machine's load, Ray's "
                             "raylet at nice 15 can miss its fixed 30 s start-up wait: run the script at nice 5 "
                             "with --child-nice 0)")
    parser.add_argument("--workers", default="0,1,2", help="engines to run: 0 = local, 1 and 2 = Ray workers")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each prepare this many times, with --before the two codes' order reversed "
                             "every other time (a loaded machine's drift falls on both)")
    parser.add_argument("--out", default="", help="also write every measurement as JSON here")
    parser.add_argument("--tables-from", default="",
                        help="print the tables of a JSON that --out wrote, measure nothing")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.tables_from:
        rows = json.loads(Path(args.tables_from).read_text(encoding="utf-8"))
        now = [r for r in rows if r.get("code", "this checkout") == "this checkout"]
        print("\n\n".join(part(now) for part in (speed_table, memory_table, fit_table, traffic_table)))
        if any(r.get("code", "this checkout") != "this checkout" for r in rows if r["what"] == "dedup"):
            print("\n" + before_after_table([r for r in rows if r["what"] == "dedup" and
                                             r["corpus"].startswith("synthetic")]))
        if any(r.get("written") for r in rows):
            print("\n" + writes_table(rows))
        return
    started, load = time.time(), os.getloadavg()
    rows = run(args, Path(tempfile.mkdtemp(prefix="bench_ray_")))
    from pipeline.accel import describe_cpu

    print(f"machine: {describe_cpu()}; "
          f"load average {load} at the start, {os.getloadavg()} at the end; {time.time() - started:.0f} s")
    now = [r for r in rows if r.get("code", "this checkout") == "this checkout"]
    for part in (speed_table, memory_table, fit_table, traffic_table):
        print(part(now), end="\n\n")
    if args.before and any(r["what"] == "dedup" for r in rows):
        print(before_after_table([r for r in rows if r["what"] == "dedup" and r["corpus"].startswith("synthetic")]),
              end="\n\n")
    if any(r.get("written") for r in rows):
        print(writes_table(rows), end="\n\n")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
