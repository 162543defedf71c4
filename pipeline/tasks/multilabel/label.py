"""Label stage: a row's raw labels (one string: a list column joined by LIST, or a text column's labels joined by
label.separator) to a multi-hot `label` over the label names; and the strata a stratified split keeps rare labels by."""

from __future__ import annotations

import functools
import sys
from collections import Counter, defaultdict

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, add_up
from pipeline.data.io.readers import LABEL_LIST as LIST  # how the reader joins a list column's labels
from pipeline.schema import LabelConfig
from pipeline.tasks.classification import label as single

EXAMPLES = single.EXAMPLES  # ids the unknown-label error shows per label


def parse(raw: str, separator: str, mapping: dict[str, str]) -> list[str]:
    """A row's label names, each once, first seen first: `raw` cut at LIST and at `separator` (none when empty),
    each piece stripped of spaces and mapped (label.mapping), empty pieces dropped."""
    pieces = raw.replace(separator, LIST).split(LIST) if separator else raw.split(LIST)
    return list(dict.fromkeys(mapping.get(p, p) for p in (x.strip() for x in pieces) if p))


def _found(table, separator: str, mapping: dict, known: frozenset | None) -> tuple[Counter, dict, int]:
    """One batch's share of the label report: rows per label name (first seen first), the ids of the first
    EXAMPLES rows of each, and the rows left with no label once names outside `known` are dropped (None: none is)."""
    found, first, empty = Counter(), defaultdict(list), 0
    for doc_id, raw in zip(table.column("id").to_pylist(), table.column("label").to_pylist()):
        names = parse(raw, separator, mapping)
        found.update(names)
        for name in names:
            if len(first[name]) < EXAMPLES:
                first[name].append(doc_id)
        empty += not any(known is None or n in known for n in names)
    return found, dict(first), empty


def _add_found(partials: list) -> tuple[Counter, dict, int]:
    """_found's partials, in row order, as one."""
    found, first = single._add_found([(counts, ids) for counts, ids, _ in partials])
    return found, first, sum(empty for _, _, empty in partials)


def _unknown_error(bad: dict[str, tuple[int, list[str]]], names: list[str]) -> ValueError:
    by_rows = sorted(bad.items(), key=lambda x: -x[1][0])
    counts = ", ".join(f"{v!r} ({n} rows, e.g. ids {ids})" for v, (n, ids) in by_rows)
    return ValueError(f"labels outside label.names {names}: {counts}. Map them with label.mapping, add them to "
                      f"label.names, or set label.unknown=drop to drop them from their rows and count them")


def label(dd, cfg: LabelConfig, ctx: StageContext) -> StageResult:
    """DatasetDict with string `label` -> multi-hot `label` (int8 list, one entry per name, in names order).

    A row without labels is kept: "none of these" is a multi-label example. A label outside label.names fails
    (label.unknown=error), or is dropped from its row (drop), never the row; the rows that had each such label are
    counted in the stats (`unknown_label`), and a row left without labels is kept as one."""
    from datasets import DatasetDict, List, Value

    mapping = {str(k): str(v) for k, v in cfg.mapping.items()}
    given = [str(n) for n in cfg.names]
    fn = functools.partial(_found, separator=cfg.separator, mapping=mapping, known=frozenset(given) if given else None)
    per_split = {s: ctx.engine.reduce(dd[s], fn, _add_found, ["id", "label"], desc=f"labels {s}") for s in SPLITS}
    found, first, _ = _add_found(list(per_split.values()))
    names = given or sorted(found)
    if not names:
        raise ValueError("no labels found: every row's label is empty; give the source a label column (a list, or "
                         f"labels joined by label.separator {cfg.separator!r})")
    index = {n: i for i, n in enumerate(names)}
    bad = {name: (n, first[name]) for name, n in found.items() if name not in index}  # label -> (rows, first ids)
    if bad and cfg.unknown == "error":
        raise _unknown_error(bad, names)
    absent = [n for n in names if not found[n]]
    if absent:  # a typo, or source.max_rows on a sorted file; a warning, as classification's
        print(f"warning: label.names lists {absent} but no document has that label: the model gets a label it never "
              f"sees (found: {dict(sorted(found.items()))})", file=sys.stderr)

    def multi_hot(batch):
        rows = []
        for raw in batch["label"]:
            hot = [0] * len(names)
            for name in parse(raw, cfg.separator, mapping):
                if name in index:  # label.unknown=drop: the others leave their row
                    hot[index[name]] = 1
            rows.append(hot)
        return {"label": rows}

    feature = List(Value("int8"))
    out = {}
    for s in SPLITS:
        mapped = ctx.engine.map_batches(dd[s], multi_hot, {"label": feature}, desc=f"label {s}")
        # Ray's map wrote the feature; datasets' map infers int64 lists, so the local engine's result is cast
        out[s] = mapped if mapped.features["label"] == feature else mapped.cast_column("label", feature)
    # each row names a label once, so rows per name are the kept labels' counts
    counts = {s: {n: per_split[s][0][n] for n in names} for s in SPLITS}
    stats = {
        "label_names": names, "threshold": cfg.threshold,
        "class_counts": counts,
        "rows_without_labels": {s: per_split[s][2] for s in SPLITS},
        "label_cardinality": {s: round(sum(counts[s].values()) / max(dd[s].num_rows, 1), 6) for s in SPLITS},
        "classes_without_documents": absent,
        "unknown_label": {name: n for name, (n, _) in bad.items()},
    }
    return StageResult(DatasetDict(out), {}, stats)


def check_config(cfg: LabelConfig) -> None:
    """label.rules (single-label only), and label.names: each once, none that label.separator would cut."""
    if cfg.rules:
        raise ValueError("label.rules: task=multilabel takes a row's labels from its label column only; rules label "
                         "unlabelled text with one class (task=classification)")
    single.check_config(cfg)
    cut = [str(n) for n in cfg.names if (cfg.separator and cfg.separator in str(n)) or LIST in str(n)]
    if cut:
        raise ValueError(f"label.names {cut} contain label.separator {cfg.separator!r}, which cuts a row's labels "
                         f"apart; set another label.separator")


def _counts(table, separator: str, mapping: dict) -> Counter:
    """Rows per label name in one batch of raw labels."""
    return Counter(n for raw in table.column("label").to_pylist() for n in parse(raw, separator, mapping))


def rarest(raw: str, counts: dict[str, int], separator: str, mapping: dict) -> str:
    """A row's stratum: its rarest label of those counted (fewest rows; ties by name), "" for a row with none."""
    return min((n for n in parse(raw, separator, mapping) if n in counts), key=lambda n: (counts[n], n), default="")


def strata(cfg, ds, engine) -> functools.partial:
    """split.stratify: each row's stratum is its rarest label over the whole of `ds`, so each rare label is spread
    over the splits in proportion where it has rows enough; labels outside label.names (when given) do not count."""
    mapping = {str(k): str(v) for k, v in cfg.label.mapping.items()}
    fn = functools.partial(_counts, separator=cfg.label.separator, mapping=mapping)
    counts = engine.reduce(ds, fn, add_up, ["label"], desc="label counts")
    given = {str(n) for n in cfg.label.names}
    kept = {n: c for n, c in counts.items() if not given or n in given}
    return functools.partial(rarest, counts=kept, separator=cfg.label.separator, mapping=mapping)
