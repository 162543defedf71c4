"""The dedup stage: drop exact and near-duplicate texts, keep one per cluster, report the clusters.

method=none keeps every row; exact groups rows whose normalized text (casefolded, whitespace
collapsed) is the same; minhash first does that, then clusters the distinct texts whose shingle
sets have Jaccard >= dedup.threshold (MinHash + LSH candidates, checked, union-find; see minhash.py).
A cluster can be a chain (A~B, B~C): every removed row's similarity to the kept one is reported.

The kept row of a cluster is the one with the longest normalized text (characters), ties broken by
the smallest id, then the smallest raw text: a choice that depends on the rows alone, never on their
order in the dataset (exact copies differ only in case and spacing, so the smallest id wins there).
Counted drops: `exact_duplicate` (same normalized text as the kept row) and `near_duplicate`.
The report `clusters.jsonl` has one line per cluster of two or more rows:
  {"kept": id, "size": n, "text": ..., "removed": [{"id", "kind": "exact"|"near", "similarity", "text"}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from pipeline.config import DedupConfig
from pipeline.data import minhash
from pipeline.data.common import StageContext, StageResult

REPORT = "clusters.jsonl"
SNIPPET_CHARS = 200  # text kept per row in the report


@dataclass
class Plan:
    """What dedup decided for a list of texts (row indices into that list)."""

    keep: list[int]  # rows kept, ascending
    clusters: list[dict]  # {"kept": row, "removed": [(row, kind, similarity), ...]}, by kept id
    stats: dict = field(default_factory=dict)


def _rank(norm: list[str], ids: list[str], texts: list[str]):
    """Sort key of a row: smaller is kept. Longest normalized text, then smallest id, text, row."""
    return lambda i: (-len(norm[i]), ids[i], texts[i], i)


def _exact_groups(norm: list[str], rank) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Rows kept by exact dedup, one per distinct normalized text: (R,) ascending, and for those
    that have copies, the copies' rows (a dict keyed by the normalized text finds them)."""
    seen: dict[str, int] = {}
    first = np.array([seen.setdefault(t, i) for i, t in enumerate(norm)], dtype=np.int64)
    is_rep = first == np.arange(len(norm))
    groups: dict[int, list[int]] = {}
    for i in np.flatnonzero(~is_rep).tolist():
        groups.setdefault(int(first[i]), [int(first[i])]).append(i)
    copies: dict[int, list[int]] = {}
    for rows in groups.values():
        rows.sort(key=rank)
        is_rep[rows] = False
        is_rep[rows[0]] = True
        copies[rows[0]] = rows[1:]
    return np.flatnonzero(is_rep), copies


def _near_clusters(reps: np.ndarray, texts: list[str], cfg: DedupConfig) -> tuple[np.ndarray, object, dict]:
    """Union-find label of each representative (R,), the sketch of the representatives, and stats."""
    sk, procs = minhash.sketch([texts[i] for i in reps.tolist()], cfg, cfg.num_proc)
    found = minhash.near_duplicate_pairs(sk, cfg)
    stats = {
        "candidate_pairs": found.candidates,
        "verified_pairs": len(found.pairs),
        "false_positives_dropped": found.candidates - len(found.pairs),
        "check": "exact_jaccard" if cfg.verify else "minhash_estimate",
        "lsh_bands": found.bands,
        "lsh_rows": found.rows,
        "signature_processes": procs,
    }
    return minhash.union_find(len(reps), found.pairs), sk, stats


def plan_dedup(texts: list[str], ids: list[str], cfg: DedupConfig) -> Plan:
    """Decide which rows to keep (method exact or minhash) and describe every cluster."""
    norm = [minhash.normalize_text(t) for t in texts]
    rank = _rank(norm, ids, texts)
    reps, copies = _exact_groups(norm, rank)
    stats: dict = {"method": cfg.method}
    labels, sk = np.arange(len(reps)), None
    if cfg.method == "minhash":
        labels, sk, more = _near_clusters(reps, texts, cfg)
        stats.update(more)
    removed = _removed_per_kept(reps, copies, labels, sk, rank)
    keep = np.ones(len(texts), dtype=bool)
    for rows in removed.values():
        keep[[r for r, _, _ in rows]] = False
    by_similarity = lambda row: (-row[2], rank(row[0]))  # noqa: E731
    order = sorted(removed, key=lambda k: (ids[k], k))  # by kept id: the report does not depend on row order
    clusters = [{"kept": k, "removed": sorted(removed[k], key=by_similarity)} for k in order]
    stats["clusters"] = len(clusters)
    return Plan(np.flatnonzero(keep).tolist(), clusters, stats)


def _removed_per_kept(reps: np.ndarray, copies: dict, labels: np.ndarray, sk, rank) -> dict[int, list]:
    """kept row -> [(removed row, "exact" | "near", Jaccard with the kept row)], for every cluster.
    Only clusters of two or more distinct texts need Python; the rest is the exact copies."""
    members: dict[int, list[int]] = {}  # label -> positions in reps
    for pos in np.flatnonzero(np.bincount(labels, minlength=len(reps))[labels] > 1).tolist():
        members.setdefault(int(labels[pos]), []).append(pos)
    best = {lab: min(group, key=lambda p: rank(int(reps[p]))) for lab, group in members.items()}
    near = np.array([[p, best[lab]] for lab, group in members.items() for p in group if p != best[lab]], dtype=np.int64)
    sim = minhash.exact_jaccard(sk, near).tolist() if len(near) else []
    removed: dict[int, list] = {k: [(r, "exact", 1.0) for r in rows] for k, rows in copies.items()}
    for (p, b), s in zip(near.tolist(), sim):
        kept, gone = int(reps[b]), int(reps[p])
        removed.setdefault(kept, []).extend((r, "near", round(s, 4)) for r in [gone, *copies.get(gone, [])])
        removed.pop(gone, None)  # its exact copies now count as near duplicates of `kept`
    return removed


def write_report(plan: Plan, texts: list[str], ids: list[str], path) -> None:
    """One JSON line per cluster: kept id, size, and each removed id with its similarity."""
    with open(path, "w", encoding="utf-8") as f:
        for c in plan.clusters:
            line = {
                "kept": ids[c["kept"]],
                "size": 1 + len(c["removed"]),
                "text": texts[c["kept"]][:SNIPPET_CHARS],
                "removed": [
                    {"id": ids[r], "kind": kind, "similarity": sim, "text": texts[r][:SNIPPET_CHARS]}
                    for r, kind, sim in c["removed"]
                ],
            }
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def dedup(ds, cfg: DedupConfig, ctx: StageContext) -> StageResult:
    """The stage: `ds` with columns id, text, label, source_split; the same columns out."""
    if cfg.method == "none":
        return StageResult(ds, {}, {"method": "none"})
    texts, ids = ds["text"][:], ds["id"][:]  # whole-column slices: lists, fast (iterating a Column is not)
    plan = plan_dedup(texts, ids, cfg)
    write_report(plan, texts, ids, ctx.out_dir / REPORT)
    kinds = [kind for c in plan.clusters for _, kind, _ in c["removed"]]
    dropped = {"exact_duplicate": kinds.count("exact"), "near_duplicate": kinds.count("near")}
    out = ds.select(np.array(plan.keep, dtype=np.int64)) if len(plan.keep) < len(texts) else ds
    return StageResult(out, dropped, {**plan.stats, "report": REPORT})
