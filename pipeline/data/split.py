"""Split stage: documents to train/validation/test, a leakage check across splits, and chunking.

A document's split comes from a seeded hash of its id, never from its row position, so adding
documents never moves the others (stratify=false) or moves only the few that sit at a class's
quantile boundaries (stratify=true, which gives exact per-class proportions). Chunks are cut
after the assignment, so every chunk of a document lands in the document's split.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import numpy as np

from pipeline.config import SplitConfig
# the local engine's leakage check runs minhash (common.LocalEngine.cross_duplicates): split's code fingerprint follows it
from pipeline.data import minhash  # noqa: F401
from pipeline.data.common import SPLITS, StageContext, StageResult, column, unit_hash

SOURCE_SPLIT_NAMES = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
                      "val": "validation", "dev": "validation", "test": "test", "testing": "test"}
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


def assign(ids: list[str], labels: list[str], ratios: tuple[float, float, float], seed: int, stratify: bool) -> list[str]:
    """Split name per document. Hash thresholds, or per-class hash ranks cut at the ratios."""
    u = [unit_hash(seed, i) for i in ids]
    cut_train, cut_val = ratios[0], ratios[0] + ratios[1]
    if not stratify:
        return ["train" if x < cut_train else "validation" if x < cut_val else "test" for x in u]
    out = [""] * len(ids)
    by_label: dict[str, list[int]] = defaultdict(list)
    for k, lab in enumerate(labels):
        by_label[lab].append(k)
    for members in by_label.values():
        members.sort(key=lambda k: (u[k], ids[k]))
        n = len(members)
        n_train, n_val = round(n * cut_train), round(n * cut_val)
        for rank, k in enumerate(members):
            out[k] = "train" if rank < n_train else "validation" if rank < n_val else "test"
    return out


def source_split_names(raw: list[str]) -> list[str]:
    """The canonical split (train/validation/test) of each row's source split name; "" stays ""
    when no row has one. A name that is not a split (or a known alias) is an error."""
    if not any(raw):
        return list(raw)
    unknown = sorted({r for r in raw if r.lower() not in SOURCE_SPLIT_NAMES})
    if unknown:
        raise ValueError(
            f"source split names {unknown} are not train/validation/test (or a known alias: "
            f"{', '.join(sorted(SOURCE_SPLIT_NAMES))}); set split.use_source_split=false to re-split by ratio"
        )
    return [SOURCE_SPLIT_NAMES[r.lower()] for r in raw]


def _from_source(ds, cfg: SplitConfig) -> list[str] | None:
    """Use the source's own split; a missing validation split is carved from train by hash."""
    raw = column(ds, "source_split")
    if not cfg.use_source_split or not any(raw):
        return None
    names = source_split_names(raw)
    if "validation" not in names and cfg.validation > 0:
        share = cfg.validation / (cfg.train + cfg.validation)
        ids = column(ds, "id")
        names = [
            "validation" if n == "train" and unit_hash(cfg.seed, ids[k]) < share else n for k, n in enumerate(names)
        ]
    return names


def chunk_text(text: str, cfg: SplitConfig) -> list[str]:
    """Cut a long text into chunks of at most chunk_size words (sentences kept whole where possible)."""
    words = text.split()
    if cfg.chunk == "none" or len(words) <= cfg.chunk_size:
        return [text]
    if cfg.chunk == "words":
        stride = cfg.chunk_size - cfg.chunk_overlap
        starts = range(0, max(len(words) - cfg.chunk_overlap, 1), stride)
        return [" ".join(words[s : s + cfg.chunk_size]) for s in starts]
    chunks, current = [], []
    for sentence in _SENTENCE_END.split(text):
        sw = sentence.split()
        if current and len(current) + len(sw) > cfg.chunk_size:
            chunks.append(" ".join(current))
            current = []
        while len(sw) > cfg.chunk_size:  # one sentence longer than a chunk: cut it by words
            chunks.append(" ".join(sw[: cfg.chunk_size]))
            sw = sw[cfg.chunk_size :]
        current += sw
    if current:
        chunks.append(" ".join(current))
    return chunks


def _chunk_rows(ds, cfg: SplitConfig, ctx: StageContext):
    from datasets import Value

    def cut(batch):
        out = {k: [] for k in ("id", "text", "label", "chunk")}
        for doc_id, text, label in zip(batch["id"], batch["text"], batch["label"]):
            for k, piece in enumerate(chunk_text(text, cfg)):
                out["id"].append(doc_id)
                out["text"].append(piece)
                out["label"].append(label)
                out["chunk"].append(k)
        return out

    added = {**{k: ds.features[k] for k in ("id", "text", "label")}, "chunk": Value("int64")}
    return ctx.engine.map_batches(ds, cut, added, remove_columns=ds.column_names, desc="chunk")


def leakage_checks(keep_test_whole: bool) -> tuple[tuple[str, str], ...]:
    """(query split, reference split) pairs, in order; a leaking query document is the one removed.
    Today's check: validation and test against train. With the test split kept whole, the test
    split is the reference: train and validation documents near one are removed instead, then
    validation against what is left of train."""
    if keep_test_whole:
        return ("train", "test"), ("validation", "test"), ("validation", "train")
    return ("validation", "train"), ("test", "train")


def _ids_at(engine, ds, rows: list[int]) -> dict[int, str]:
    """{row: id} of only the rows named (the engine reads those rows' ids, not the whole column)."""
    wanted = sorted(set(rows))
    return dict(zip(wanted, engine.fetch(ds, wanted, "id")))


def _leakage(parts: dict, cfg: SplitConfig, ctx: StageContext) -> tuple[dict, dict]:
    """Find documents with a near duplicate across splits; drop them from the query side when
    cfg says so. leakage.jsonl: one line per leaking document, by check then id (not row order),
    naming the split it was removed from (null: kept)."""
    dropped, leaks = {}, []
    checks = leakage_checks(getattr(ctx.similarity, "keep_test_whole", False))
    for name, ref in checks:
        query, reference = parts[name], parts[ref]
        if query.num_rows == 0 or reference.num_rows == 0:
            continue
        hits = ctx.engine.cross_duplicates(reference, query, ctx.similarity, cfg.leakage_threshold, ctx.num_proc)
        qids = _ids_at(ctx.engine, query, [q for q, _, _ in hits])
        rids = _ids_at(ctx.engine, reference, [r for _, r, _ in hits])
        removed = name if cfg.leakage == "remove" else None
        leaks += sorted(({"split": name, "id": qids[q], f"{ref}_id": rids[r], "jaccard": round(j, 4),
                          "removed": removed} for q, r, j in hits), key=lambda row: row["id"])  # not row order
        if hits and removed:
            bad = {q for q, _, _ in hits}
            keep = np.ones(query.num_rows, dtype=bool)
            keep[sorted(bad)] = False
            parts[name] = query.select(np.flatnonzero(keep).tolist())  # a list: the fingerprint as before
            dropped[f"leak_{name}"] = dropped.get(f"leak_{name}", 0) + len(bad)
    with open(ctx.out_dir / "leakage.jsonl", "w", encoding="utf-8") as f:
        for row in leaks:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    found = {name: sum(1 for r in leaks if r["split"] == name) for name in dict(checks)}
    return dropped, found


def split(ds, cfg: SplitConfig, ctx: StageContext) -> StageResult:
    """Dataset with id/text/label/source_split -> DatasetDict train/validation/test (+ chunk column).
    The leakage check uses the MinHash settings of ctx.similarity (the dedup section)."""
    from datasets import DatasetDict

    names = _from_source(ds, cfg)
    source_kept = names is not None
    if names is None:
        names = assign(column(ds, "id"), column(ds, "label"), (cfg.train, cfg.validation, cfg.test), cfg.seed, cfg.stratify)
    rows: dict[str, list[int]] = {s: [] for s in SPLITS}
    for k, name in enumerate(names):
        rows[name].append(k)
    if not rows["train"]:  # a tokenizer trained on nothing, and nothing to train on
        how = ("the source's own split has none; set split.use_source_split=false to split by ratio" if source_kept
               else f"{len(names)} documents are too few for split.train={cfg.train}")
        raise ValueError(f"the train split is empty: {how}")
    base = ds.remove_columns("source_split")
    parts = {s: base.select(rows[s]) for s in SPLITS}
    dropped, found = ({}, {}) if cfg.leakage == "off" else _leakage(parts, cfg, ctx)
    docs = {s: parts[s].num_rows for s in SPLITS}
    out = DatasetDict({s: _chunk_rows(parts[s], cfg, ctx) for s in SPLITS})
    stats = {"source_split_kept": source_kept, "documents": docs, "rows": {s: out[s].num_rows for s in SPLITS},
             "leaks_found": found}
    return StageResult(out, dropped, stats)
