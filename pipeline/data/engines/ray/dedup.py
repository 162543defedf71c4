"""The dedup stage on Ray with no per-row state on the driver (RayEngine.dedup calls `dedup`).

N rows in B blocks (engine.block_bounds), P = B shuffle partitions, global row numbers throughout. The
driver holds O(B x P) object refs, counts, the verified pairs when at most ray.driver_edges of them,
and streams the report from the tasks' files; every per-row array lives in a task or the object store:
  1. _hash_block (per block): the blake2b-128 of each row's normalized text; (h0, h1, row) hash-partitioned;
  2. _exact_groups (per hash partition): equal hashes grouped, the rows' normalized texts read and
     compared (a collision never merges two texts); each exact group of 2+ labelled by its smallest row
     (dedup.first_of_texts's label). Out: per block the rows that are an exact copy of a smaller row
     (not sketched), and the (first, member) pairs partitioned by first;
  3. the near search over the other rows (shuffle.verified_pairs, nodes = global rows) and its
     components (shuffle.near_components): (node, label) of each near-clustered node, partitioned by node;
  4. _cluster_keys (per partition, the join of 2 and 3): each grouped row's cluster key, the label of its
     first when that is near-clustered, else the first; each near-clustered node's, its label (both
     rows; a label is near-clustered and a first that is not never is, so two clusters never share one);
     (key, row) partitioned by key;
  5. _plan_clusters (per partition): whole clusters, their rows' id, text and source_split read here and
     planned by dedup.plan_rows, the local engine's rule, on those rows alone: within a cluster the rank,
     the kept row and the order are the global plan's (the rows keep their relative order, and the exact
     Jaccard comes from the rows' own shingles, a value that depends on the two texts only), and between
     clusters the report is ordered by (kept id, kept row). Each writes its report lines to a file in
     that order; the driver merges the P files (heapq.merge, O(P) lines in memory) into clusters.jsonl;
  6. ray_io.drop_rows (per block): the block's rows less the removed ones, written as one Arrow shard.
Why an exact group's node is its smallest row rather than its best-ranked one (the representative the
local engine signs): all of a group's rows have one normalized text, hence the same shingles and
signature, so the near graph's components are the same whichever row stands for the group, and only
the components matter to the plan (plan_rows ranks each cluster itself). So steps 1-4 read no id or
source_split, and the rank is computed once, in step 5, by the shared rule.
A giant component lands whole in one task of step 5 (its rows' strings in one worker); min-label
propagation (more than ray.driver_edges verified pairs) keeps an (N,) label vector in the object store.
One more place per-row bytes can sit: Ray keeps a task's return values smaller than its
max_direct_call_object_size (100 KiB by default) in their owner's memory, and the driver owns every
return here, so the small pieces of steps 1-5 (with many blocks and partitions, all of them) stay in the
driver's process until their refs go: measured ~13 B per short document at 300k and 4 partitions
(bench/results/ray.md); a cluster that dedups billions of rows wants that Ray setting lowered (_system_config).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.engines.ops import TEXT
from pipeline.data.engines.ray import io as ray_io
from pipeline.data.engines.ray import tasks
from pipeline.data.engines.ray.shuffle import by_key, near_components, split_by, verified_pairs
from pipeline.data.similarity import minhash
from pipeline.data.similarity.shingling import normalize_text, shingle_hashes
from pipeline.data.stages.dedup import dropped_counts, first_of_texts, near_stats, plan_rows, report_lines

# ---------------------------------------------------------------- task bodies (run on Ray workers)


def _hash_block(packed: tuple, start: int, end: int, parts: int) -> Any:
    """Per hash partition, an (M, 3) uint64 array of (blake2b-128 of the normalized text: 2 words, row)."""
    norm = [normalize_text(t) for t in ray_io.open_packed(packed).select(range(start, end))[TEXT][:]]
    digest = b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in norm)
    h = np.frombuffer(digest, dtype=np.uint64).reshape(-1, 2)
    triples = np.concatenate([h, np.arange(start, end, dtype=np.uint64)[:, None]], axis=1)
    return tasks._one_or_list(by_key(triples, h[:, 0] ^ h[:, 1], parts))


def _exact_groups(packed: tuple, starts: np.ndarray, parts: int, *triples: np.ndarray) -> list:
    """[rows that copy a smaller row (count), then per block those rows, then per partition (by first)
    the (first, member) pairs (K, 2) of each exact group of two or more], for one hash partition."""
    t = np.concatenate(triples) if triples else np.zeros((0, 3), dtype=np.uint64)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]  # by hash, then row
    head = np.ones(len(t), dtype=bool)
    head[1:] = (t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1])
    gid = np.cumsum(head) - 1
    shared = np.bincount(gid)[gid] > 1 if len(t) else head
    rows, gid = t[shared, 2].astype(np.int64), gid[shared]
    asc = np.argsort(rows)
    norm = np.empty(len(rows), dtype=object)
    if len(rows):
        norm[asc] = [normalize_text(x) for x in ray_io.open_packed(packed).select(rows[asc])[TEXT][:]]
    seen: dict = {}  # rows ascending within a hash group: each text's group is labelled by its smallest row
    first = np.array([seen.setdefault(k, r) for k, r in zip(zip(gid.tolist(), norm.tolist()), rows.tolist())],
                     dtype=np.int64)
    _, inverse, sizes = np.unique(first, return_inverse=True, return_counts=True)
    grouped = sizes[inverse.ravel()] > 1  # a hash group's rows with another text apart: a collision
    pairs = np.stack([first[grouped], rows[grouped]], axis=1)
    copies = np.sort(pairs[pairs[:, 0] != pairs[:, 1], 1])
    return [len(copies), *split_by(copies, tasks.block_of(copies, starts), len(starts) - 1),
            *by_key(pairs, pairs[:, 0], parts)]


def _cluster_keys(parts: int, labelled: np.ndarray, *pairs: np.ndarray) -> Any:
    """Per partition (by key), the (key, row) pairs (K, 2) of one partition of firsts: each exact group's
    rows keyed by its first's near label (`labelled`: (node, label) pairs of the near-clustered nodes),
    else by the first; each near-clustered node by its label."""
    fm = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    labelled = labelled[np.argsort(labelled[:, 0])]
    nodes, labels = labelled[:, 0], labelled[:, 1]
    at = np.minimum(np.searchsorted(nodes, fm[:, 0]), max(len(nodes) - 1, 0))
    hit = nodes[at] == fm[:, 0] if len(nodes) else np.zeros(len(fm), dtype=bool)
    key = np.where(hit, labels[at] if len(nodes) else 0, fm[:, 0])
    keyed = np.unique(np.concatenate([np.stack([key, fm[:, 1]], axis=1), labelled[:, ::-1]]), axis=0)
    return tasks._one_or_list(by_key(keyed, keyed[:, 0], parts))


def _shingle_jaccard(texts: list[str], cfg: Any, pairs: np.ndarray) -> np.ndarray:
    """(K,) exact Jaccard of pairs (K, 2) of normalized `texts`, from their shingles alone."""
    hashes, offsets = shingle_hashes(texts, cfg.shingle, cfg.ngram, True)
    sk = minhash.Sketch(np.zeros((len(texts), 0), dtype=np.uint32), hashes, offsets)
    return minhash.ShingleSets(sk, pairs).jaccard(pairs)


def _plan_clusters(packed: tuple, starts: np.ndarray, cfg: Any, splits: Any, path: str, *keyed: np.ndarray) -> list:
    """[counts (exact and near drops, clusters, test rows removed, kept within test), then per block the
    rows removed] of the clusters of one key partition, planned by dedup.plan_rows; their report lines
    written to `path`, each after its sort key ([kept id, kept row] as JSON) and a tab."""
    kr = np.unique(np.concatenate(keyed), axis=0) if keyed else np.zeros((0, 2), dtype=np.int64)
    kr = kr[np.argsort(kr[:, 1])]
    rows, keys = kr[:, 1], kr[:, 0]
    counts, removed = np.zeros(5, dtype=np.int64), np.zeros(0, dtype=np.int64)
    with open(path, "w", encoding="utf-8") as f:
        if len(rows):
            cols = ray_io.open_packed(packed).select(rows).select_columns(["id", TEXT, "source_split"])[:]
            ids, texts = cols["id"], cols[TEXT]
            norm = [normalize_text(t) for t in texts]
            length = np.fromiter(map(len, norm), dtype=np.int64, count=len(norm))
            protected, is_test = splits.flags(cols["source_split"])

            def near(reps: np.ndarray):  # a cluster's reps share its key; label: the smallest rep's position
                _, head, inverse = np.unique(keys[reps], return_index=True, return_inverse=True)
                texts_of = [norm[i] for i in reps.tolist()]
                return head[inverse.ravel()], functools.partial(_shingle_jaccard, texts_of, cfg), {}

            plan = plan_rows(first_of_texts(norm), length, cfg, near, ids, texts, protected)
            for kept, line in report_lines(plan, texts, ids):
                f.write(json.dumps([ids[kept], int(rows[kept])], ensure_ascii=False) + "\t" + line)
            dropped = dropped_counts(plan)
            counts[:] = [dropped["exact_duplicate"], dropped["near_duplicate"], plan.stats["clusters"],
                         is_test[plan.removed].sum(), plan.stays.sum()]
            removed = np.sort(rows[plan.removed])
    return [counts, *split_by(removed, tasks.block_of(removed, starts), len(starts) - 1)]


# ---------------------------------------------------------------- the driver's side


def _merge_reports(paths: list[Path], out: Path) -> None:
    """The partitions' report files, each sorted by its lines' key, merged into one by that key."""
    with contextlib.ExitStack() as stack, open(out, "w", encoding="utf-8") as f:
        # a line ends at \n only, as written
        files = [stack.enter_context(open(p, encoding="utf-8", newline="\n")) for p in paths]
        for line in heapq.merge(*files, key=lambda s: json.loads(s[: s.index("\t")])):
            f.write(line[line.index("\t") + 1:])


def _grouped(engine: Any, packed: tuple, bounds: list, starts: np.ndarray, parts: int) -> list:
    """Steps 1 and 2: per hash partition, the refs _exact_groups returns."""
    import ray

    hashed = ray.remote(_hash_block).options(num_returns=parts, **engine.task_options())
    group = ray.remote(_exact_groups).options(num_returns=1 + len(bounds) + parts, **engine.task_options())
    mapped = [tasks.as_list(hashed.remote(packed, s, e, parts)) for s, e in bounds]
    return [group.remote(packed, starts, parts, *[m[p] for m in mapped]) for p in range(parts)]


def _near(engine: Any, n: int, packed: tuple, cfg: Any, grouped: list, parts: int, blocks: int) -> tuple[list, dict]:
    """Step 3: the refs of the near-clustered nodes' (node, label) pairs per partition, and the stats."""
    import ray

    if cfg.method != "minhash":
        return [ray.put(np.zeros((0, 2), dtype=np.int64))] * parts, {}
    copies = sum(engine.get([g[0] for g in grouped], "dedup (exact groups)"))
    excluded = [[g[1 + k] for g in grouped] for k in range(blocks)]
    checked, candidates, verified, sketches, b, r = verified_pairs(
        engine, n, lambda s, e: [(packed, range(s, e))], cfg, cfg.threshold, True, excluded=excluded,
        sketched=n - copies)
    stats = near_stats(candidates, verified, cfg, b, r, len(sketches))
    return near_components(engine, n, checked, verified, parts), stats


def dedup(engine: Any, ds: Any, cfg: Any, splits: Any, report: Path) -> tuple:
    """dedup.dedup_lists's answer (kept rows, drops, stats, (test rows removed, kept within test)) and
    report, from the chain of tasks above."""
    import ray

    n, packed = ds.num_rows, ray_io.pack(ds)
    bounds = engine.block_bounds(n)
    parts, blocks = len(bounds), len(bounds)
    starts = np.array([s for s, _ in bounds] + [n], dtype=np.int64)
    grouped = _grouped(engine, packed, bounds, starts, parts)
    labelled, near = _near(engine, n, packed, cfg, grouped, parts, blocks)
    keys = ray.remote(_cluster_keys).options(num_returns=parts, **engine.task_options())
    keyed = [tasks.as_list(keys.remote(parts, labelled[q], *[g[1 + blocks + q] for g in grouped])) for q in range(parts)]
    folder = engine.map_folder()
    paths = [folder / f"clusters-{q:05d}.jsonl" for q in range(parts)]
    plan = ray.remote(_plan_clusters).options(num_returns=1 + blocks, **engine.task_options())
    planned = [plan.remote(packed, starts, cfg, splits, str(paths[q]), *[k[q] for k in keyed]) for q in range(parts)]
    exact, near_dropped, clusters, test_removed, copies = (
        int(x) for x in np.sum(engine.get([p[0] for p in planned], "dedup (planning the clusters)"), axis=0))
    _merge_reports(paths, report)
    out = ds
    if exact + near_dropped:
        out = ray_io.drop_rows(engine, ds, [[p[1 + k] for p in planned] for k in range(blocks)], "dedup (writing the kept rows)")
    stats = {"method": cfg.method, **near, "clusters": clusters}
    return out, {"exact_duplicate": exact, "near_duplicate": near_dropped}, stats, (test_removed, copies)
