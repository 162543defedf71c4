"""The split stage's n-gram contamination check (split.contamination): validation/test documents sharing a word
n-gram with train, and train documents sharing one with split.contamination_files, listed in contamination.jsonl
and removed with `remove`. Its arithmetic is pipeline/data/similarity/ngrams.py's; it moves rows only through
the engine's reduce and map_filter, so the Ray engine gives the local engine's rows and file, and its driver
holds the smaller side's n-gram hashes, never rows."""

from __future__ import annotations

import functools
import json

import numpy as np

from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import TEXT, add_up, concat
from pipeline.data.io import references
from pipeline.data.similarity import ngrams
from pipeline.schema import SplitConfig


def _gram_hashes(table, n: int) -> np.ndarray:
    return ngrams.word_ngrams(table.column(TEXT).to_pylist(), n).hashes


def _shared_pairs(table, n: int, wanted: np.ndarray) -> list[tuple[int, str]]:
    """(n-gram hash, id) of every row of a batch and each of the sorted hashes `wanted` it holds."""
    return ngrams.pairs(table.column(TEXT).to_pylist(), table.column("id").to_pylist(), n, wanted)


_MARKS = ("_found", "_covered", "_words", "_first")  # a remove pass's per-row overlap, dropped with the rows


def _records(ids: list, texts: list, overlap: tuple, n: int, shared: np.ndarray) -> list[dict]:
    """contamination.jsonl's fields of the rows of a batch that hold a shared n-gram, and the hashes they hold."""
    found, covered, words, first = overlap
    return [{"id": ids[r], "ngram": ngrams.ngram_text(texts[r], n, int(first[r])), "ngrams_found": int(found[r]),
             "overlap": round(int(covered[r]) / int(words[r]), 4),
             "hashes": ngrams.found_hashes(texts[r], n, shared).tolist()} for r in np.flatnonzero(found).tolist()]


def _hits(table, n: int, shared: np.ndarray) -> tuple[list, int, int]:
    """A batch's (records, rows, rows under n words): the report pass, which keeps every row."""
    texts = table.column(TEXT).to_pylist()
    overlap = ngrams.overlaps(texts, n, shared)
    return _records(table.column("id").to_pylist(), texts, overlap, n, shared), len(texts), int(np.sum(overlap[2] < n))


def _mark(batch: dict, n: int, shared: np.ndarray) -> dict:
    """The remove pass's map: each row's overlap as columns, for its filter and its tally."""
    return {k: v.tolist() for k, v in zip(_MARKS, ngrams.overlaps(batch[TEXT], n, shared))}


def _unmarked(table):
    import pyarrow.compute as pc

    return pc.equal(table.column("_found"), 0)


def _tally_marked(table, n: int, shared: np.ndarray) -> tuple[list, int, int]:
    overlap = tuple(np.asarray(table.column(k).to_numpy(), dtype=np.int64) for k in _MARKS)
    return (_records(table.column("id").to_pylist(), table.column(TEXT).to_pylist(), overlap, n, shared),
            table.num_rows, int(np.sum(overlap[2] < n)))


MAX_REFERENCE_IDS = 5  # per contaminated document in contamination.jsonl (reference_count says how many)


def check_pair(engine, query, reference, ref_engine, n: int, name: str, against: str, remove: bool,
           collect_query: bool) -> tuple[object, list, dict]:
    """One check of `query` (rows where `engine` runs) against `reference` (where `ref_engine` runs):
    (the query less what it removes, its records, its counts). The driver holds the n-gram hashes of the
    smaller side only (`collect_query`: validation/test against train; else the evaluation files), the
    (hash, id) pairs the two sides share, and the records of the rows found; the rows stay where the engine
    keeps them (on Ray: in tasks, as clean's filter)."""
    from datasets import Value

    small, small_engine = (query, engine) if collect_query else (reference, ref_engine)
    wanted = np.unique(small_engine.reduce(small, functools.partial(_gram_hashes, n=n), concat, [TEXT],
                                           desc=f"{name if collect_query else against} n-grams"))
    pairs = ref_engine.reduce(reference, functools.partial(_shared_pairs, n=n, wanted=wanted), add_up,
                              ["id", TEXT], desc=f"{against} n-grams shared") if len(wanted) else []
    sources: dict[int, set] = {}
    for h, doc_id in pairs:
        sources.setdefault(h, set()).add(doc_id)
    shared = np.array(sorted(sources), dtype=np.uint64)
    if remove and len(shared):
        added = {k: Value("int64") for k in _MARKS}
        query, (found, rows, short) = engine.map_filter(
            query, functools.partial(_mark, n=n, shared=shared), added, _unmarked, drop=list(_MARKS),
            tally=functools.partial(_tally_marked, n=n, shared=shared), combine=add_up, batch_size=1000,
            desc=f"contamination {name}")
    else:
        found, rows, short = engine.reduce(query, functools.partial(_hits, n=n, shared=shared), add_up,
                                           ["id", TEXT], desc=f"contamination {name}")
    records = []
    for hit in sorted(found, key=lambda x: x["id"]):  # by id, not row order: the same on every engine
        refs = sorted({i for h in hit.pop("hashes") for i in sources.get(h, ())})
        records.append({"split": name, "id": hit["id"], "against": against, "reference_ids": refs[:MAX_REFERENCE_IDS],
                        "reference_count": len(refs), **hit, "removed": name if remove else None})
    return query, records, {"split": name, "against": against, "documents": rows, "too_short": short,
                            "contaminated": len(records)}


def check(parts: dict, cfg: SplitConfig, ctx: StageContext, split_pairs: tuple) -> tuple[dict, dict]:
    """The n-gram contamination check, after the leakage check: the query documents of `split_pairs` (split's
    leakage_checks: (query split, reference split) pairs) that share a word n-gram with their reference
    split, then train against split.contamination_files; those
    found removed from the query side when cfg says so. contamination.jsonl: one line per document found,
    by check then id, with the reference documents holding its n-grams, its first such n-gram and the share
    of its words those n-grams cover."""
    from datasets import Dataset

    n, dropped, records, checks = cfg.contamination_ngram, {}, [], []
    pairs = [(name, ref, parts[ref], ctx.engine) for name, ref in split_pairs]
    if cfg.contamination_files:
        ids, texts = references.read(list(cfg.contamination_files))
        pairs.append(("train", "contamination_files", Dataset.from_dict({"id": ids, TEXT: texts}), LocalEngine()))
    remove = cfg.contamination == "remove"
    for name, against, reference, ref_engine in pairs:
        if parts[name].num_rows == 0 or reference.num_rows == 0:
            continue
        parts[name], found, counts = check_pair(ctx.engine, parts[name], reference, ref_engine, n, name, against, remove,
                                            collect_query=ref_engine is ctx.engine)
        records += found
        checks.append(counts)
        if found and remove:
            dropped[f"contaminated_{name}"] = dropped.get(f"contaminated_{name}", 0) + len(found)
    with open(ctx.out_dir / "contamination.jsonl", "w", encoding="utf-8") as f:
        for row in records:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return dropped, {"ngram": n, "policy": cfg.contamination, "checks": checks}
