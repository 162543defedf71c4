"""Label stage: raw labels (or rules over unlabelled text) to class ids with a ClassLabel feature."""

from __future__ import annotations

import functools
import re
import sys
from collections import Counter, defaultdict

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, TEXT
from pipeline.schema import LabelConfig
import pipeline.tasks.classification.review as review  # the module alone: not the package, in the stage's code fingerprint

MISSING = "<missing>"  # how an empty raw label that no rule matched is reported


def compile_rules(rules: list) -> list[tuple[re.Pattern, str]]:
    out = []
    for k, rule in enumerate(rules):
        if not isinstance(rule, dict) or set(rule) != {"pattern", "label"}:
            raise ValueError(f"label.rules[{k}] must be a mapping with exactly the keys 'pattern' and 'label', got {rule!r}")
        try:
            out.append((re.compile(str(rule["pattern"]), re.IGNORECASE), str(rule["label"])))
        except re.error as e:
            raise ValueError(f"label.rules[{k}].pattern {rule['pattern']!r} is not a valid regex: {e}") from None
    return out


def resolve(raw: str, text: str, mapping: dict[str, str], rules: list[tuple[re.Pattern, str]]) -> str:
    """The class name of one row: mapped raw label, else the first matching rule, else MISSING."""
    if raw != "":
        return mapping.get(raw, raw)
    for pattern, name in rules:
        if pattern.search(text):
            return name
    return MISSING


EXAMPLES = 3  # ids the unknown-label error shows per value


def _names_found(table, mapping: dict, rules: list) -> tuple[Counter, dict]:
    """One batch's share of the label report: rows per resolved class name (first seen first), and
    the ids of the first EXAMPLES rows of each name."""
    found, first = Counter(), defaultdict(list)
    for doc_id, raw, text in zip(*(table.column(c).to_pylist() for c in ("id", "label", TEXT))):
        name = resolve(raw, text, mapping, rules)
        found[name] += 1
        if len(first[name]) < EXAMPLES:
            first[name].append(doc_id)
    return found, dict(first)


def _add_found(partials: list) -> tuple[Counter, dict]:
    """_names_found's partials, in row order, as one."""
    found, first = Counter(), defaultdict(list)
    for counts, ids in partials:
        found += counts
        for name, some in ids.items():
            first[name] = (first[name] + some)[:EXAMPLES]
    return found, dict(first)


def names_per_split(dd, engine, mapping: dict, rules: list) -> dict[str, tuple[Counter, dict]]:
    """Per split, _names_found over its rows, reduced by `engine` (on Ray: in tasks, per block)."""
    fn = functools.partial(_names_found, mapping=mapping, rules=rules)
    return {s: engine.reduce(dd[s], fn, _add_found, ["id", "label", TEXT], desc=f"labels {s}") for s in SPLITS}


def class_names(cfg: LabelConfig, found: Counter) -> list[str]:
    if cfg.names:  # repeats are refused when the config is loaded
        return [str(n) for n in cfg.names]
    return sorted(set(found) - {MISSING})


def _unknown_error(bad: dict[str, tuple[int, list[str]]], names: list[str]) -> ValueError:
    by_rows = sorted(bad.items(), key=lambda x: -x[1][0])
    counts = ", ".join(f"{v!r} ({n} rows, e.g. ids {ids})" for v, (n, ids) in by_rows)
    return ValueError(
        f"labels outside the classes {names}: {counts}. Map them with label.mapping, add them to label.names, "
        f"add label.rules for unlabelled text, or set label.unknown=drop to drop and count them"
    )


def _known(table):
    """A mapped batch's rows whose label is a class (-1: unknown, dropped)."""
    import pyarrow.compute as pc

    return pc.greater_equal(table.column("label"), 0)


def _rows(table) -> int:
    return table.num_rows


def label(dd, cfg: LabelConfig, ctx: StageContext) -> StageResult:
    """DatasetDict with string `label` -> int ClassLabel `label`; unknown labels fail or are dropped."""
    from datasets import ClassLabel, DatasetDict

    mapping = {str(k): str(v) for k, v in cfg.mapping.items()}
    rules = compile_rules(cfg.rules)
    per_split = names_per_split(dd, ctx.engine, mapping, rules)
    found, first = _add_found(list(per_split.values()))
    names = class_names(cfg, found)
    if not names:
        raise ValueError("no labels found: the source has no label column values and no label.rules matched")
    index = {n: i for i, n in enumerate(names)}
    bad = {name: (n, first[name]) for name, n in found.items() if name not in index}  # value -> (rows, first ids)
    if bad and cfg.unknown == "error":
        raise _unknown_error(bad, names)
    absent = [n for n in names if not found[n]]
    if absent:  # an empty class folder, a typo; a warning, not an error: source.max_rows on a sorted file does it too
        print(f"warning: label.names lists {absent} but no document has that label: the model gets a class it never "
              f"sees (found: {dict(sorted(found.items()))})", file=sys.stderr)

    reviews, reviewed = _reviews(dd, cfg, ctx, names, mapping, rules)
    fixed = {doc: index.get(label, -1) for doc, (label, _) in reviews.items()}  # review.DROP: -1, dropped

    def to_id(batch):
        ids = [index.get(resolve(r, t, mapping, rules), -1) for r, t in zip(batch["label"], batch[TEXT])]
        return {"label": [fixed.get(d, k) for d, k in zip(batch["id"], ids)] if fixed else ids}

    out, added = {}, {"label": ClassLabel(names=names)}
    for s in SPLITS:
        # an empty split is built with the final feature: cast_column does nothing on zero rows
        if bad or -1 in fixed.values():  # dropping: the map and the filter in one pass (on Ray: tasks write only the kept rows)
            kept, _ = ctx.engine.map_filter(dd[s], to_id, added, _known, drop=[], tally=_rows, combine=sum,
                                            desc=f"label {s}")
        else:
            kept = ctx.engine.map_batches(dd[s], to_id, added, desc=f"label {s}")
        same = kept.features["label"] == ClassLabel(names=names)  # Ray's map wrote it so; cast_column is a pass
        out[s] = kept if same else kept.cast_column("label", ClassLabel(names=names))
    dropped = {"unknown_label": sum(n for k, (n, _) in bad.items() if k != MISSING),
               "missing_label": bad.get(MISSING, (0,))[0]}
    result = DatasetDict(out)
    # the kept rows are those whose name is a class, so their counts are the counts found (same first-seen order)
    counts = {s: {n: c for n, c in per_split[s][0].items() if n in index} for s in SPLITS}
    stats = {"label_names": names, "class_counts": counts, "classes_without_documents": absent}
    if reviews:
        stats["review"], dropped["review_drop"] = _apply_review(reviews, reviewed, counts, cfg.review_file)
    return StageResult(result, {k: v for k, v in dropped.items() if v}, stats)


def _reviews(dd, cfg: LabelConfig, ctx: StageContext, names: list, mapping: dict, rules: list) -> tuple[dict, dict]:
    """label.review_file read and checked against the classes and the data: (id -> (label, where), split -> id ->
    (rows, its label before the review)); ({}, {}) without a review file."""
    if not cfg.review_file:
        return {}, {}
    reviews = review.read(cfg.review_file)
    review.check_labels(reviews, names)
    name_of = functools.partial(resolve, mapping=mapping, rules=rules)
    return reviews, review.rows_per_split(dd, ctx.engine, reviews, SPLITS, name_of)


def _apply_review(reviews: dict, reviewed: dict, counts: dict, path: str) -> tuple[dict, int]:
    """The review's effect on the per-split class counts (updated in place); returns what the manifest records of it
    (documents relabelled, dropped, listed with the label they had) and the rows dropped."""
    relabeled, dropped, unchanged, rows_dropped = 0, 0, 0, 0
    for split, found in reviewed.items():
        for doc, (rows, old) in found.items():
            new = reviews[doc][0]
            if new == old:
                unchanged += 1
                continue
            if old in counts[split]:
                counts[split][old] -= rows
            if new == review.DROP:
                dropped, rows_dropped = dropped + 1, rows_dropped + rows
            else:
                relabeled += 1
                counts[split][new] = counts[split].get(new, 0) + rows
    summary = {"file": str(path), "sha256": review.fingerprint(path), "relabeled": relabeled, "dropped": dropped,
               "unchanged": unchanged}
    return summary, rows_dropped


def check_config(cfg: LabelConfig) -> None:
    """label.names and label.rules, checked before any data is read (not when the label stage runs)."""
    names = [str(n) for n in cfg.names]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"label.names repeats {', '.join(map(repr, repeated))}; each class is named once")
    compile_rules(cfg.rules)
    if cfg.review_file:
        review.read(cfg.review_file)  # a missing file or a malformed row, before any data is read
