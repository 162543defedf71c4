"""Split stage: documents to train/validation/test, a leakage check across splits, and chunking.

A document's split comes from a seeded hash of its id, never from its row position, so adding
documents never moves the others (stratify=false) or moves only the few that sit at a class's
quantile boundaries (stratify=true, which gives exact per-class proportions). Chunks are cut
after the assignment, so every chunk of a document lands in the document's split.
"""

from __future__ import annotations

import functools
import json
import re

import numpy as np

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import SPLITS, TEXT, add_up, concat, fetch, unit_hash
from pipeline.data.similarity import minhash
from pipeline.data.stages import contamination, pair_sides
from pipeline.schema import SplitConfig

SOURCE_SPLIT_NAMES = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
                      "val": "validation", "dev": "validation", "test": "test", "testing": "test"}
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


CODES = {name: k for k, name in enumerate(SPLITS)}  # a split as the int8 the assignment gives each row


def _distinct(table, name: str, stratum=None) -> set:
    """The distinct values of one column of a batch (with `stratum`: of its values' strata)."""
    import pyarrow.compute as pc

    values = pc.unique(table.column(name)).to_pylist()
    return set(values) if stratum is None else {stratum(v) for v in values}


def _ids(table) -> list[str]:
    return table.column("id").to_pylist()


def _hash_codes(table, seed: int, cuts: tuple[float, float]) -> np.ndarray:
    """(rows,) int8 split codes of a batch by hash thresholds (stratify=false)."""
    u = np.array([unit_hash(seed, i) for i in _ids(table)], dtype=np.float64)
    return np.where(u < cuts[0], 0, np.where(u < cuts[1], 1, 2)).astype(np.int8)


def _hash_and_class(table, seed: int, classes: list[str], stratum=None) -> tuple[np.ndarray, np.ndarray]:
    """(rows,) float64 hashes and (rows,) int32 class indices of a batch (stratify=true); a row's class is its
    label, or with `stratum` (a task's strata) its label's stratum."""
    index = {c: k for k, c in enumerate(classes)}
    u = np.array([unit_hash(seed, i) for i in _ids(table)], dtype=np.float64)
    labels = table.column("label").to_pylist()
    return u, np.array([index[c if stratum is None else stratum(c)] for c in labels], dtype=np.int32)


def _stratified_codes(u: np.ndarray, cls: np.ndarray, cuts: tuple[float, float], ids_of) -> np.ndarray:
    """Per class, its rows ranked by (hash, id) and cut at the ratios. Only rows whose (class, hash)
    another row shares (53-bit floats: rare) need their ids, asked of `ids_of(rows ascending)`."""
    codes = np.empty(len(u), dtype=np.int8)
    if not len(u):
        return codes
    order = np.lexsort((u, cls))  # by class, then hash
    su, sc = u[order], cls[order]
    same = (su[1:] == su[:-1]) & (sc[1:] == sc[:-1])
    tied = np.flatnonzero(np.r_[same, False] | np.r_[False, same])
    if len(tied):
        rows = np.sort(order[tied])
        ids = dict(zip(rows.tolist(), ids_of(rows)))
        order[tied] = sorted(order[tied].tolist(), key=lambda k: (cls[k], u[k], ids[k]))
    bounds = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1], True])
    for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rank = np.arange(e - s)
        n_train, n_val = round((e - s) * cuts[0]), round((e - s) * cuts[1])
        codes[order[s:e]] = np.where(rank < n_train, 0, np.where(rank < n_val, 1, 2))
    return codes


def cut_points(ratios: tuple[float, float, float]) -> tuple[float, float]:
    """Where train ends and validation ends, as fractions of the hash range (or of a class's rank)."""
    return ratios[0], ratios[0] + ratios[1]


def label_classes(ds, engine, stratum=None) -> list[str]:
    """The distinct labels (or their strata) of `ds`, sorted: the classes a stratified split ranks within."""
    return sorted(engine.reduce(ds, functools.partial(_distinct, name="label", stratum=stratum), add_up, ["label"],
                                desc="classes"))


def assign_codes(ds, engine, ratios: tuple[float, float, float], seed: int, stratify: bool,
                 stratum=None) -> np.ndarray:
    """(rows,) int8 split code (CODES) of each row of `ds` (id, label): hash thresholds, or per-class
    hash ranks cut at the ratios. The hashes are computed where `engine` reduces (on Ray: in tasks);
    stratified, the ranking needs them all, so the driver receives 8 B of hash + 4 B of class per row
    (and the ids of tied rows only), never the id or label columns."""
    cuts = cut_points(ratios)
    if not stratify:
        return engine.reduce(ds, functools.partial(_hash_codes, seed=seed, cuts=cuts), concat, ["id"], desc="split")
    classes = label_classes(ds, engine, stratum)
    u, cls = engine.reduce(ds, functools.partial(_hash_and_class, seed=seed, classes=classes, stratum=stratum), concat,
                           ["id", "label"], desc="split")
    return _stratified_codes(u, cls, cuts, lambda rows: fetch(engine, ds, rows, ("id",))[0])


def assign(ids: list[str], labels: list[str], ratios: tuple[float, float, float], seed: int, stratify: bool) -> list[str]:
    """Split name per document (assign_codes over these lists, in this process)."""
    from datasets import Dataset

    codes = assign_codes(Dataset.from_dict({"id": list(ids), "label": list(labels)}), LocalEngine(), ratios, seed,
                         stratify)
    return [SPLITS[c] for c in codes.tolist()]


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


def _source_codes(table, seed: int, share: float) -> np.ndarray:
    """(rows,) int8 codes of a batch's source split names (checked already); with share > 0, that
    share of train carved into validation by hash."""
    names = [SOURCE_SPLIT_NAMES[r.lower()] for r in table.column("source_split").to_pylist()]
    return np.array([CODES["validation"] if share and n == "train" and unit_hash(seed, i) < share else CODES[n]
                     for n, i in zip(names, _ids(table))], dtype=np.int8)


def source_share(ds, cfg: SplitConfig, engine) -> float | None:
    """None when the split is not the source's own (not asked for, or no row names one); else the
    share of train carved into validation by hash (0 when the source has a validation split). The
    driver receives the distinct source split names only."""
    if not cfg.use_source_split:
        return None
    raw = engine.reduce(ds, functools.partial(_distinct, name="source_split"), add_up, ["source_split"],
                        desc="source splits")
    if not any(raw):
        return None
    names = source_split_names(sorted(raw))
    return cfg.validation / (cfg.train + cfg.validation) if "validation" not in names and cfg.validation > 0 else 0


def _from_source(ds, cfg: SplitConfig, engine) -> np.ndarray | None:
    """Codes of the source's own split (source_share); 1 B per row to the driver."""
    share = source_share(ds, cfg, engine)
    if share is None:
        return None
    return engine.reduce(ds, functools.partial(_source_codes, seed=cfg.seed, share=share), concat,
                         ["id", "source_split"], desc="source splits")


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


def whole_documents(table):
    """A pyarrow batch of documents as _chunk_rows makes it when split.chunk is none: id, text, label
    and chunk 0. An engine that writes the split's rows anyway (Ray's route) adds it in that pass."""
    import pyarrow as pa

    table = table.select(["id", TEXT, "label"])
    return table.append_column("chunk", pa.array(np.zeros(table.num_rows, dtype=np.int64)))


def chunked_features(features):
    """The features of _chunk_rows's rows, from its input's."""
    from datasets import Features, Value

    return Features({**{k: features[k] for k in ("id", TEXT, "label")}, "chunk": Value("int64")})


def _chunk_rows(ds, cfg: SplitConfig, ctx: StageContext):
    if "chunk" in ds.column_names:  # the engine's split already wrote whole documents (split.chunk=none)
        return ds

    def cut(batch):
        out = {k: [] for k in ("id", TEXT, "label", "chunk")}
        for doc_id, text, label in zip(batch["id"], batch[TEXT], batch["label"]):
            for k, piece in enumerate(chunk_text(text, cfg)):
                out["id"].append(doc_id)
                out[TEXT].append(piece)
                out["label"].append(label)
                out["chunk"].append(k)
        return out

    return ctx.engine.map_batches(ds, cut, dict(chunked_features(ds.features)), remove_columns=ds.column_names,
                                  desc="chunk")


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
    (ids,) = fetch(engine, ds, wanted, ("id",))
    return dict(zip(wanted, ids))


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
        hits = ctx.engine.cross_duplicates(reference, query, ctx.similarity, cfg.leakage_threshold,
                                           minhash.cross_duplicates)
        qids = _ids_at(ctx.engine, query, [q for q, _, _ in hits])
        rids = _ids_at(ctx.engine, reference, [r for _, r, _ in hits])
        removed = name if cfg.leakage == "remove" else None
        leaks += sorted(({"split": name, "id": qids[q], f"{ref}_id": rids[r], "jaccard": round(j, 4),
                          "removed": removed} for q, r, j in hits), key=lambda row: row["id"])  # not row order
        if hits and removed:
            bad = sorted({q for q, _, _ in hits})
            parts[name] = ctx.engine.drop_rows(query, bad)  # on Ray: a pass of tasks writing the rest
            dropped[f"leak_{name}"] = dropped.get(f"leak_{name}", 0) + len(bad)
    with open(ctx.out_dir / "leakage.jsonl", "w", encoding="utf-8") as f:
        for row in leaks:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    found = {name: sum(1 for r in leaks if r["split"] == name) for name in dict(checks)}
    return dropped, found


def split_rows(ds, cfg: SplitConfig, engine, stratum=None) -> tuple[dict, bool]:
    """({split: its rows of `ds`, less source_split}, whether the source's own split was kept): the
    codes of every row (assign_codes or _from_source), then a select per split (8 B per row). The
    local engine's way; the Ray engine's (ray_split.py) routes the rows in tasks by the same rules."""
    codes = _from_source(ds, cfg, engine)
    source_kept = codes is not None
    if codes is None:
        codes = assign_codes(ds, engine, (cfg.train, cfg.validation, cfg.test), cfg.seed, cfg.stratify, stratum)
    base = ds.remove_columns("source_split")
    return {s: base.select(np.flatnonzero(codes == CODES[s])) for s in SPLITS}, source_kept


def split(ds, cfg: SplitConfig, ctx: StageContext) -> StageResult:
    """Dataset with id/text/label/source_split -> DatasetDict train/validation/test (+ chunk column).
    The leakage check uses the MinHash settings of ctx.similarity (the dedup section)."""
    from datasets import DatasetDict

    stratum = ctx.strata(ds, ctx.engine) if ctx.strata is not None and cfg.stratify else None
    parts, source_kept = ctx.engine.split_rows(ds, cfg, split_rows, stratum)
    if not parts["train"].num_rows:  # a tokenizer trained on nothing, and nothing to train on
        how = ("the source's own split has none; set split.use_source_split=false to split by ratio" if source_kept
               else f"{ds.num_rows} documents are too few for split.train={cfg.train}")
        raise ValueError(f"the train split is empty: {how}")
    dropped, found = ({}, {}) if cfg.leakage == "off" else _leakage(parts, cfg, ctx)
    checks = leakage_checks(getattr(ctx.similarity, "keep_test_whole", False))
    contaminated, ngram_stats = ({}, {}) if cfg.contamination == "off" else contamination.check(parts, cfg, ctx, checks)
    dropped.update(contaminated)
    sides = pair_sides.check(parts, ctx, checks) if ctx.pairs else None
    docs = {s: parts[s].num_rows for s in SPLITS}
    out = DatasetDict({s: _chunk_rows(parts[s], cfg, ctx) for s in SPLITS})
    stats = {"source_split_kept": source_kept, "documents": docs, "rows": {s: out[s].num_rows for s in SPLITS},
             "leaks_found": found, "contamination": ngram_stats, **({"pair_sides": sides} if sides else {})}
    return StageResult(out, dropped, stats)
