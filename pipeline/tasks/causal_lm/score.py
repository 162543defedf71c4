"""Language-model metrics of a split from each block's summed negative log-likelihood and target count:
exact over the whole split (token-weighted, not a mean of batch means)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def lm_metrics(rows: np.ndarray, block_bytes: Any) -> dict:
    """loss (nats per target token), perplexity = exp(loss), bits per byte = total nats / ln 2 / the split's
    UTF-8 bytes (comparable across tokenizers), and the counts behind them."""
    nll, tokens = float(np.sum(rows[:, 0], dtype=np.float64)), int(round(float(np.sum(rows[:, 1], dtype=np.float64))))
    n_bytes = int(np.sum(np.asarray(block_bytes, dtype=np.int64)))
    loss = nll / tokens if tokens else float("nan")
    return {"loss": loss, "perplexity": math.exp(loss) if tokens else float("nan"),
            "bits_per_byte": nll / math.log(2) / n_bytes if n_bytes else float("nan"),
            "tokens": tokens, "bytes": n_bytes, "blocks": int(len(rows))}


def score_rows(rows: np.ndarray, ds: Any, info: dict) -> dict:
    return lm_metrics(rows, ds["bytes"][:])


def evaluate(rows: np.ndarray, dataset: Any, info: dict) -> dict:
    return {"lm": lm_metrics(rows, dataset["bytes"][:])}


def write_report(tmp, metrics: dict, rows: np.ndarray, dataset: Any, eval_cfg: Any) -> None:
    """Per-block loss (blocks.jsonl): where in the split the model is worst."""
    import json

    with open(tmp / "blocks.jsonl", "w", encoding="utf-8") as f:
        for i, (nll, n) in enumerate(rows.tolist()):
            f.write(json.dumps({"block": i, "loss": nll / n if n else None, "tokens": int(n)}) + "\n")


def summary(metrics: dict) -> str:
    m = metrics["lm"]
    return (f"perplexity {m['perplexity']:.3f}   bits per byte {m['bits_per_byte']:.4f}   loss {m['loss']:.4f} nats/token"
            f"   ({m['tokens']:,} target tokens, {m['bytes']:,} bytes, {m['blocks']:,} blocks)")
