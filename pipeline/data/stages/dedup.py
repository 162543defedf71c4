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

dedup.keep_test_whole (benchmark mode, for a source with its own test split): test rows are
protected. They rank before every other row, so a cluster with a test member keeps a test row,
and no test row is removed: the cluster's train/validation members are (cross-split copies), and
its other test members stay and are listed under "kept_within_test" (same fields as "removed").
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Iterator

import numpy as np

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import TEXT, add_up, column
from pipeline.data.similarity import minhash
from pipeline.data.stages.split import SOURCE_SPLIT_NAMES, source_split_names
from pipeline.schema import DedupConfig

REPORT = "clusters.jsonl"
SNIPPET_CHARS = 200  # text kept per row in the report


@dataclass
class Plan:
    """What dedup decided for a list of texts (row indices into that list). The members (every
    row of a cluster but its kept one) are in report order: by their kept row's id, then
    similarity (highest first), then rank."""

    keep: np.ndarray  # (K,) rows kept, ascending
    members: np.ndarray  # (D,) the other rows of each cluster
    kept_of: np.ndarray  # (D,) the kept row of each member's cluster
    near: np.ndarray  # (D,) bool: a near duplicate of its kept row (else an exact one)
    similarity: list[float]  # (D,) Jaccard with the kept row, rounded to 4 places
    stays: np.ndarray  # (D,) bool: a protected (test) row, kept although it is a copy
    protected: bool = False  # planned with protected rows (dedup.keep_test_whole)
    stats: dict = field(default_factory=dict)

    @property
    def removed(self) -> np.ndarray:
        """(R,) the rows removed, in report order."""
        return self.members[~self.stays]


class _Rank:
    """The order rows are kept in, smaller first: a protected row first, then the longest normalized
    text (`length` (N,), characters), then the smallest id, raw text, row (`ids`, `texts`: lists by
    row; `protected` (N,) bool or None). Asked of a few rows at a time, in numpy: the ids (and, among
    rows sharing an id, the texts) are put in order by one Python sort of those rows' strings."""

    def __init__(self, length: np.ndarray, ids: list[str], texts: list[str], protected: np.ndarray | None = None):
        self.length, self.ids, self.texts, self.protected = length, ids, texts, protected

    def places(self, rows: np.ndarray) -> np.ndarray:
        """(M,) each of `rows`' place when they are sorted by rank (0 = the one kept first)."""
        by_id = _string_codes([self.ids[i] for i in rows.tolist()])
        by_text = np.zeros(len(rows), dtype=np.int64)
        tied = np.flatnonzero(np.bincount(by_id, minlength=len(rows))[by_id] > 1)  # rows sharing an id
        by_text[tied] = _string_codes([self.texts[i] for i in rows[tied].tolist()])
        keys = [rows, by_text, by_id, -self.length[rows]]
        if self.protected is not None:
            keys.append(~self.protected[rows])  # False (protected) sorts first
        places = np.empty(len(rows), dtype=np.int64)
        places[np.lexsort(keys)] = np.arange(len(rows))
        return places


def _string_codes(strings: list[str]) -> np.ndarray:
    """(M,) each string's place among the distinct strings in Python's order (equal strings, equal codes)."""
    order = sorted(range(len(strings)), key=strings.__getitem__)
    ordered = [strings[k] for k in order]
    new = np.fromiter(map(operator.ne, ordered[1:], ordered[:-1]), dtype=bool, count=max(len(strings) - 1, 0))
    codes = np.empty(len(strings), dtype=np.int64)
    codes[order] = np.concatenate(([0], np.cumsum(new)))[: len(strings)]
    return codes


def _best_of_groups(rows: np.ndarray, group: np.ndarray, rank: _Rank) -> np.ndarray:
    """(M,) the best-ranked row of each row's group, for rows (M,) with group labels (M,):
    one sort by rank, then arrays, with no Python loop per group or member."""
    order = np.lexsort((rank.places(rows), group))  # by group, the best first
    head = np.ones(len(rows), dtype=bool)
    head[1:] = group[order][1:] != group[order][:-1]
    best = np.empty_like(rows)
    best[order] = rows[order][head][np.cumsum(head) - 1]
    return best


def first_of_texts(norm: list[str]) -> np.ndarray:
    """(N,) the smallest row with the same normalized text as each row (its exact group's label)."""
    seen: dict[str, int] = {}
    return np.fromiter(map(seen.setdefault, norm, range(len(norm))), dtype=np.int64, count=len(norm))


def _distinct(texts: list[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(N,) each row's index among the distinct `texts` (in order of first appearance), those
    distinct texts, and (D,) the row where each first appears."""
    seen: dict[str, int] = {}
    # each row's first row with its text: a dict call per row from C (`map`), no Python frame per row
    first = np.fromiter(map(seen.setdefault, texts, range(len(texts))), dtype=np.int64, count=len(texts))
    new = first == np.arange(len(texts))  # a text's first row
    return (np.cumsum(new) - 1)[first], list(seen), np.flatnonzero(new)


def _copied(first: np.ndarray) -> np.ndarray:
    """(M,) the rows (ascending) in an exact group of two or more."""
    return np.flatnonzero(np.bincount(first, minlength=len(first))[first] > 1)


def _exact_groups(first: np.ndarray, rank: _Rank) -> np.ndarray:
    """(N,) the kept row of each row's exact group (labels `first`, from first_of_texts)."""
    kept = np.arange(len(first))
    copied = _copied(first)
    kept[copied] = _best_of_groups(copied, first[copied], rank)
    return kept


def near_stats(candidates: int, verified: int, cfg: DedupConfig, bands: int, rows: int, procs: int) -> dict:
    """The manifest's MinHash counts, whichever engine found the pairs."""
    return {
        "candidate_pairs": candidates,
        "verified_pairs": verified,
        "false_positives_dropped": candidates - verified,
        "check": "exact_jaccard" if cfg.verify else "minhash_estimate",
        "lsh_bands": bands,
        "lsh_rows": rows,
        "signature_processes": procs,
    }


def _near_clusters(sk: minhash.Sketch, procs: int, cfg: DedupConfig, keys: tuple | None = None) -> tuple:
    """Connected-component label of each sketched text (R,) (the smallest index of its component),
    exact Jaccard of pairs of them (a function of (K, 2) indices), and stats (`procs`: the processes
    that signed them; keys: their band keys and columns' texts, when the sketch keeps no signatures). The texts are the
    exact groups' representatives. The Ray engine finds the same components with the same minhash
    functions, spread over a cluster (shuffle.py)."""
    found = minhash.near_duplicate_pairs(sk, cfg, keys=keys)
    stats = near_stats(found.candidates, len(found.pairs), cfg, found.bands, found.rows, procs)
    return minhash.union_find(len(sk.offsets) - 1, found.pairs), lambda pairs: _jaccard(sk, found, pairs), stats


def _jaccard(sk, found, pairs: np.ndarray) -> np.ndarray:
    """(K,) exact Jaccard of pairs (K, 2) of sketched texts in the same clusters: a verified pair's
    own where it is one (most members join their kept text directly), else from the candidates'
    shingle sets, which hold every clustered text (clusters join verified pairs only)."""
    if found.sets is None:  # the check used estimates; the report's similarities are exact anyway
        return minhash.ShingleSets(sk, pairs).jaccard(pairs)
    pairs = np.sort(pairs, axis=1)  # i < j, as the verified pairs are
    n = len(sk.offsets) - 1
    known = found.pairs[:, 0] * n + found.pairs[:, 1]  # ascending: band_candidates sorts
    code = pairs[:, 0] * n + pairs[:, 1]
    at = np.minimum(np.searchsorted(known, code), max(len(known) - 1, 0))
    hit = known[at] == code
    sim = np.empty(len(pairs))
    sim[hit] = found.similarity[at[hit]]
    sim[~hit] = found.sets.jaccard(pairs[~hit])
    return sim


def _kept_per_rep(reps: np.ndarray, labels: np.ndarray, jaccard, rank: _Rank) -> tuple[np.ndarray, np.ndarray]:
    """(R,) the kept row of each representative's near cluster, and (R,) its Jaccard with it."""
    clustered = np.flatnonzero(np.bincount(labels, minlength=len(reps))[labels] > 1)
    kept = reps.copy()
    kept[clustered] = _best_of_groups(reps[clustered], labels[clustered], rank)
    gone = clustered[kept[clustered] != reps[clustered]]
    sim = np.ones(len(reps))
    sim[gone] = jaccard(np.stack([gone, np.searchsorted(reps, kept[gone])], axis=1))
    return kept, sim


def plan_dedup(texts: list[str], ids: list[str], cfg: DedupConfig, num_proc: int = 1,
               protected: np.ndarray | None = None) -> Plan:
    """Decide which rows to keep (method exact or minhash) and describe every cluster, in this process
    (shingles and signatures in `num_proc` processes). `protected` (N,) bool: rows never removed (the
    test split under dedup.keep_test_whole). Each distinct raw text is normalized at most once."""
    code, distinct, first_row = _distinct(texts)
    if cfg.method == "minhash" and cfg.shingle == "word":
        label, length, search = _word_minhash(distinct, code, cfg, num_proc)
    else:
        norm = [minhash.normalize_text(t) for t in distinct]
        label = first_of_texts(norm)
        length = np.fromiter(map(len, norm), dtype=np.int64, count=len(norm))[code]

        def search(reps: np.ndarray):
            return _near_clusters(*minhash.sketch([norm[i] for i in code[reps].tolist()], cfg, num_proc,
                                                  normalized=True), cfg)

    return plan_rows(first_row[label][code], length, cfg, search, ids, texts, protected)


def _word_minhash(distinct: list[str], code: np.ndarray, cfg: DedupConfig, num_proc: int) -> tuple:
    """plan_dedup's exact groups (label (D,) of each distinct text, as first_of_texts gives on their
    normalized texts), normalized lengths and near search with word shingles, normalizing few texts.

    Word shingles are the words of the casefolded text, which whitespace never joins or splits, so
    the raw texts are shingled (and signed) as their normalized ones, and two texts with the same
    normalized text have the same shingle hashes in the same order. So the distinct texts are
    shingled first, and only those whose shingle hashes' sum (and count) another's equals are
    normalized, to group them exactly: most texts repeat none (normalizing all is ~1/6 of the stage
    on the tweets). The kept-row rank reads the normalized length of the rows in groups and clusters
    only, which are normalized when it asks (`_NormalizedLengths`). Each text is casefolded once,
    for its shingles and, where needed, its normalized text."""
    folded = list(map(str.casefold, distinct))
    hashes, offsets = minhash.shingled(folded, cfg, num_proc, normalized=True)  # words need no more
    counts = np.diff(offsets)  # each text has a shingle: an empty one, that of its empty normalized text
    key = np.add.reduceat(hashes, offsets[:-1]) + counts.astype(np.uint64) * minhash.GOLD if len(distinct) else counts
    ordered = np.sort(key)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]  # (ascending) the keys of two or more texts
    maybe = np.zeros(0, dtype=np.int64)  # the texts with one of those keys, ascending (as first_of_texts wants)
    if len(repeated):
        maybe = np.flatnonzero(repeated[np.minimum(np.searchsorted(repeated, key), len(repeated) - 1)] == key)
    norm = [minhash.normalize_text(folded[i], folded=True) for i in maybe.tolist()]
    label = np.arange(len(distinct))
    label[maybe] = maybe[first_of_texts(norm)]
    length = _NormalizedLengths(folded, code)
    length.known[maybe] = np.fromiter(map(len, norm), dtype=np.int64, count=len(norm))

    def search(reps: np.ndarray):
        at = code[reps]  # the representatives' distinct texts, in the order of `reps`
        sub = np.zeros(len(at) + 1, dtype=np.int64)
        np.cumsum(counts[at], out=sub[1:])
        if (np.diff(at) > 0).all():  # ascending, as they lie in `hashes`: no reordering
            kept = np.zeros(len(distinct), dtype=bool)
            kept[at] = True
            sub_hashes = hashes if len(at) == len(distinct) else hashes[np.repeat(kept, counts)]
        else:
            sub_hashes = hashes[minhash._ranges(offsets[at], counts[at])]
        if not cfg.verify:  # the check estimates Jaccard from the signatures
            return _near_clusters(*minhash.signed(sub_hashes, sub, cfg, num_proc), cfg)
        # the exact check needs the shingles only: band keys, no (N, P) signatures in text order
        b, r = minhash.lsh_params(cfg.threshold, cfg.num_perm, cfg.bands, cfg.rows, cfg.verify)
        keys, columns, procs = minhash.signed_band_keys(sub_hashes, sub, cfg, b, r, num_proc)
        unsigned = minhash.Sketch(np.zeros((len(at), 0), dtype=np.uint32), sub_hashes, sub)
        return _near_clusters(unsigned, procs, cfg, (keys, columns))

    return label, length, search


class _NormalizedLengths:
    """The characters of each row's normalized text (`length[rows]`, as a (N,) array is indexed),
    counted when first asked (`normalized_lengths`): rows (N,) are `folded` (casefolded distinct texts)'s `code`s."""

    def __init__(self, folded: list[str], code: np.ndarray):
        self.folded, self.code = folded, code
        self.known = np.full(len(folded), -1, dtype=np.int64)  # -1: not normalized yet

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        at = self.code[rows]
        new = minhash.sorted_unique(at[self.known[at] < 0])
        self.known[new] = minhash.normalized_lengths([self.folded[i] for i in new.tolist()], folded=True)
        return self.known[at]


def plan_rows(first: np.ndarray, length: np.ndarray, cfg: DedupConfig, near, ids: list[str], texts: list[str],
              protected: np.ndarray | None = None) -> Plan:
    """The plan of N rows, whichever engine calls it (the local one on every row, Ray's tasks on the
    rows of some clusters, whole): `first` (N,) each row's exact-group label (first_of_texts), `length`
    (N,) its normalized text's characters, `near(reps)` the near clusters of rows `reps` ((labels,
    Jaccard of pairs, stats), as _near_clusters), `ids` and `texts` (raw) of the N rows."""
    n = len(first)
    rank = _Rank(length, ids, texts, protected)
    group = _exact_groups(first, rank)
    reps = np.flatnonzero(group == np.arange(n))
    stats: dict = {"method": cfg.method}
    kept_rep, sim_rep = reps, np.ones(len(reps))
    if cfg.method == "minhash":
        labels, jaccard, more = near(reps)
        stats.update(more)
        kept_rep, sim_rep = _kept_per_rep(reps, labels, jaccard, rank)
    at = np.searchsorted(reps, group)  # (N,) each row's exact group, as a position in reps
    kept = kept_rep[at]
    members = np.flatnonzero(kept != np.arange(n))
    near = group[members] != kept[members]  # copies of a removed representative are near too
    sim = np.ones(len(members))
    sim[near] = [round(s, 4) for s in sim_rep[at[members[near]]].tolist()]
    order = _report_order(members, kept[members], sim, ids, rank)
    stats["clusters"] = len(minhash.sorted_unique(kept[members]))
    stays = np.zeros(n, dtype=bool) if protected is None else protected
    keep = np.flatnonzero((kept == np.arange(n)) | stays)
    members = members[order]
    return Plan(keep, members, kept[members], near[order], sim[order].tolist(), stays[members],
                protected is not None, stats)


def _report_order(removed: np.ndarray, kept: np.ndarray, sim: np.ndarray, ids: list[str], rank: _Rank) -> np.ndarray:
    """Order of the removed rows in the report: by kept id (so the report does not depend on row
    order), then rounded similarity, highest first, then rank."""
    clusters = minhash.sorted_unique(kept)
    by_id = np.empty(len(clusters), dtype=np.int64)
    by_id[np.lexsort((clusters, _string_codes([ids[k] for k in clusters.tolist()])))] = np.arange(len(clusters))
    return np.lexsort((rank.places(removed), -sim, by_id[np.searchsorted(clusters, kept)]))


def report_lines(plan: Plan, texts: list[str], ids: list[str]) -> Iterator[tuple[int, str]]:
    """(kept row, JSON line) of each cluster, in report order: kept id, size, and each removed id with
    its similarity (and, when rows were protected, each protected copy kept within test). The one
    format of clusters.jsonl, whichever engine planned (Ray's tasks write their clusters' lines):
    `json.dumps(line, ensure_ascii=False)` of {"kept", "size", "text", "removed"[, "kept_within_test"]},
    written out field by field with json's own string encoder, each distinct snippet encoded once."""
    snippets: dict[str, str] = {}

    def snippet(row: int) -> str:
        text = texts[row]
        out = snippets.get(text)
        if out is None:
            out = snippets[text] = encode_basestring(text[:SNIPPET_CHARS])
        return out

    entries = [f'{{"id": {encode_basestring(ids[r])}, "kind": "{"near" if x else "exact"}", "similarity": {sim!r}, '
               f'"text": {snippet(r)}}}'
               for r, x, sim in zip(plan.members.tolist(), plan.near.tolist(), plan.similarity)]
    bounds = np.flatnonzero(np.diff(plan.kept_of, prepend=-1, append=-1)).tolist()  # cluster starts, then the end
    stays = plan.stays.tolist()
    for kept, s, e in zip(plan.kept_of[bounds[:-1]].tolist(), bounds[:-1], bounds[1:]):
        head = f'{{"kept": {encode_basestring(ids[kept])}, "size": {1 + e - s}, "text": {snippet(kept)}, "removed": ['
        if plan.protected:
            yield kept, (head + ", ".join(entries[k] for k in range(s, e) if not stays[k]) + '], "kept_within_test": ['
                         + ", ".join(entries[k] for k in range(s, e) if stays[k]) + "]}\n")
        else:
            yield kept, head + ", ".join(entries[s:e]) + "]}\n"


def write_report(plan: Plan, texts: list[str], ids: list[str], path) -> None:
    """clusters.jsonl: report_lines of the plan."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line for _, line in report_lines(plan, texts, ids))


def dropped_counts(plan: Plan) -> dict:
    """The manifest's drops: the removed rows, exact or near duplicates of their kept row."""
    near = int(plan.near[~plan.stays].sum())
    return {"exact_duplicate": len(plan.removed) - near, "near_duplicate": near}


@dataclass(frozen=True)
class Splits:
    """The raw source_split values that matter to dedup: `protected` those whose rows are never
    removed (dedup.keep_test_whole; None when off), `test` those counted in the test split's record.
    A few values, not rows: each engine's tasks flag their rows with them."""

    protected: frozenset | None
    test: frozenset

    def flags(self, values: list[str]) -> tuple[np.ndarray | None, np.ndarray]:
        """(N,) bool protected (None when off) and (N,) bool test, of rows with these source_split values."""
        is_test = np.fromiter((v in self.test for v in values), dtype=bool, count=len(values))
        if self.protected is None:
            return None, is_test
        return np.fromiter((v in self.protected for v in values), dtype=bool, count=len(values)), is_test


def splits_of(names: list[str], cfg: DedupConfig) -> Splits:
    """The Splits of a source whose source_split column holds the distinct values `names`. Protected
    (dedup.keep_test_whole): the values split.py reads as test; a source without a test split of its
    own is then an error."""
    # names split.py would refuse are not test rows in the record: split reports them
    test = frozenset(r for r in names if SOURCE_SPLIT_NAMES.get(r.lower()) == "test")
    if not cfg.keep_test_whole:
        return Splits(None, test)
    canonical = source_split_names(names)
    if "test" not in canonical:
        found = sorted(set(canonical) - {""}) or "none"
        raise ValueError(f"dedup.keep_test_whole=true keeps the source's own test split, but this source has "
                         f"none (its splits: {found}); set dedup.keep_test_whole=false, or name the split "
                         f"column with source.split_field")
    return Splits(frozenset(r for r, c in zip(names, canonical) if c == "test"), test)


def _test_record(rows: int, removed: int, copies: int, cfg: DedupConfig) -> dict:
    """What dedup did to the source's own test split (`rows` rows), for the record evaluate reads
    (metrics.json's test_set); {} when the source has no test split."""
    if not rows:
        return {}
    return {"test_split": {"rows": rows, "removed": removed, "kept_within_test": copies,
                           "kept_whole": cfg.keep_test_whole}}


def _split_counts(table) -> Counter:
    """Rows per source_split value, values in order of first appearance (Arrow counts them in C,
    as Counter counts the column's Python list: the same counts, nulls as None)."""
    counts = table.column("source_split").value_counts()
    return Counter(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))


def dedup_lists(ds, cfg: DedupConfig, splits: Splits, report, num_proc: int) -> tuple:
    """The local engine's dedup: plan_dedup on the columns as lists, in this process; the report
    written to `report`. (kept rows, dropped, the plan's stats, (test rows removed, kept within test))."""
    texts, ids = column(ds, TEXT), column(ds, "id")
    protected, is_test = None, None  # a source without a test split: no row to flag, the column unread
    if splits.protected is not None or splits.test:
        protected, is_test = splits.flags(column(ds, "source_split"))
    plan = plan_dedup(texts, ids, cfg, num_proc, protected)
    write_report(plan, texts, ids, report)
    out = ds.select(plan.keep) if len(plan.keep) < ds.num_rows else ds
    removed_test = int(is_test[plan.removed].sum()) if is_test is not None else 0
    return out, dropped_counts(plan), plan.stats, (removed_test, int(plan.stays.sum()))


def dedup(ds, cfg: DedupConfig, ctx: StageContext) -> StageResult:
    """The stage: `ds` with columns id, text, label, source_split; the same columns out. The engine
    dedups (`engine.dedup`): the local one with dedup_lists, Ray's in tasks (ray_dedup.py), neither
    holding more than the source_split column's distinct values and their counts for the Splits."""
    counts = ctx.engine.reduce(ds, _split_counts, add_up, ["source_split"], desc="reading source_split")
    splits = splits_of(list(counts), cfg)
    test_rows = sum(n for v, n in counts.items() if v in splits.test)
    if cfg.method == "none":
        return StageResult(ds, {}, {"method": "none", **_test_record(test_rows, 0, 0, cfg)})
    out, dropped, stats, (removed, copies) = ctx.engine.dedup(ds, cfg, splits, ctx.out_dir / REPORT, dedup_lists)
    return StageResult(out, dropped, {**stats, **_test_record(test_rows, removed, copies, cfg), "report": REPORT})
