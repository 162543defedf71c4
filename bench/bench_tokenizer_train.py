"""What a reproducible WordPiece costs: the tokenize stage's training (`tokenize._train_wordpiece`: the
## tokens found from distinct pieces, then one training with them numbered first) against tokenizers'
plain one-pass training, which numbers those tokens in a per-process hash order
(huggingface/tokenizers#1794). Also checks that 3 processes of each give the same / different bytes.

    python bench/bench_tokenizer_train.py [--docs 25000] [--words 230] [--vocab 8000] [--repeats 3]

The corpus is synthetic and IMDB-sized by default: 25k documents of 230 words drawn from a Zipf
vocabulary of 50k made-up words."""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import TokenizeConfig  # noqa: E402
from pipeline.data.stages import tokenize  # noqa: E402


def corpus(docs: int, words: int) -> list[str]:
    rng = random.Random(0)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(50_000)]
    weights = [1 / (k + 1) for k in range(len(vocab))]
    return [" ".join(rng.choices(vocab, weights, k=words)) for _ in range(docs)]


def plain(texts: list[str], cfg: TokenizeConfig):
    """tokenizers' own training, as the stage did before (one pass, ## tokens numbered as met)."""
    return tokenize._wordpiece(texts, cfg.vocab_size, cfg.min_frequency, [])


def stage(texts: list[str], cfg: TokenizeConfig):
    return tokenize._train_wordpiece(texts, cfg)[0]


def digest_in_a_process(which: str, args: argparse.Namespace) -> str:
    cmd = [sys.executable, __file__, "--digest", which, "--docs", str(args.docs // 10), "--words", str(args.words),
           "--vocab", str(args.vocab)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("digest")][-1].split()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=25_000)
    ap.add_argument("--words", type=int, default=230)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--digest", choices=("plain", "stage"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    cfg = TokenizeConfig(kind="wordpiece", vocab_size=args.vocab, min_frequency=2)
    texts = corpus(args.docs, args.words)
    if args.digest:
        tok = (plain if args.digest == "plain" else stage)(texts, cfg)
        print("digest", hashlib.sha256(tok.to_str().encode()).hexdigest()[:16])
        return
    from pipeline.accel import describe_cpu

    print(f"CPU: {describe_cpu()}; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{args.docs} documents x {args.words} words, vocab_size {args.vocab}, min_frequency 2, "
          f"median of {args.repeats} interleaved repeats\n")
    times: dict[str, list[float]] = {"plain": [], "stage": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("stage", stage)):
            t = time.perf_counter()
            fn(texts, cfg)
            times[name].append(time.perf_counter() - t)
    digests = {name: {digest_in_a_process(name, args) for _ in range(3)} for name in times}
    base = statistics.median(times["plain"])
    print("| training | seconds | vs plain | distinct tokenizers from 3 processes (1/10 of the docs) |")
    print("|---|---:|---:|---:|")
    for name, label in (("plain", "tokenizers' one pass (before)"), ("stage", "the stage's: ## tokens numbered first (now)")):
        med = statistics.median(times[name])
        print(f"| {label} | {med:.2f} | {med / base:.2f}x | {len(digests[name])} |")


if __name__ == "__main__":
    main()
