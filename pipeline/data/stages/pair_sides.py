"""The sentence-pair check of the split stage: validation/test pairs whose sides occur in train.

A pair's sides are often reused across pairs (MRPC and STS-B draw several pairs from one news cluster; a
question-pairs set reuses popular questions). A test pair is no duplicate of any train pair when both its
sides appear in train, paired with others, yet a model can have learned each side there. The check counts
such pairs (both sides, and one side), compares sides as dedup's exact key does (casefolded, whitespace
collapsed) and lists the pairs with both sides in train in pair_sides.jsonl; it removes nothing. It runs
only through `engine.reduce`, so the Ray engine gives the same counts; the driver holds the reference
split's side hashes (8 bytes per side).
"""

from __future__ import annotations

import functools
import json

import numpy as np

from pipeline.data.engines.ops import TEXT, add_up, concat
from pipeline.data.io import pair
from pipeline.data.similarity.shingling import normalize_text, text_hashes


def _hashes(texts: list[str]) -> np.ndarray:
    return text_hashes([normalize_text(t) for t in texts]) if texts else np.zeros(0, dtype=np.uint64)


def _side_hashes(table) -> np.ndarray:
    """(distinct sides,) uint64: a batch's sides, either position."""
    firsts, seconds = pair.decode_all(table.column(TEXT).to_pylist())
    return np.unique(_hashes(firsts + seconds))


def _found(table, known: np.ndarray) -> tuple[list[str], int]:
    """The ids of a batch's pairs with both sides in `known` (sorted hashes), and the count with one side."""
    firsts, seconds = pair.decode_all(table.column(TEXT).to_pylist())
    a, b = np.isin(_hashes(firsts), known), np.isin(_hashes(seconds), known)
    ids = table.column("id").to_pylist()
    return [ids[k] for k in np.flatnonzero(a & b)], int(np.count_nonzero(a ^ b))


def check(parts: dict, ctx, checks: tuple) -> dict:
    """{query split: {"both_sides": n, "one_side": n}} for each leakage check (query, reference); the pairs
    with both sides in the reference written to pair_sides.jsonl, by check then id."""
    counts, rows = {}, []
    for name, ref in checks:
        query, reference = parts[name], parts[ref]
        if query.num_rows == 0 or reference.num_rows == 0:
            counts[name] = {"both_sides": 0, "one_side": 0}
            continue
        known = np.unique(ctx.engine.reduce(reference, _side_hashes, concat, [TEXT], desc=f"{ref} sides"))
        ids, one = ctx.engine.reduce(query, functools.partial(_found, known=known), add_up, ["id", TEXT],
                                     desc=f"{name} sides in {ref}")
        counts[name] = {"both_sides": len(ids), "one_side": one}
        rows += [{"split": name, "id": i, "sides_in": ref} for i in sorted(ids)]
    with open(ctx.out_dir / "pair_sides.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return counts
