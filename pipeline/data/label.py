"""Label stage: raw labels (or rules over unlabelled text) to class ids with a ClassLabel feature."""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict

from pipeline.config import LabelConfig
from pipeline.data.common import SPLITS, StageContext, StageResult, column

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


def class_names(dd, cfg: LabelConfig, mapping: dict, rules: list) -> list[str]:
    if cfg.names:  # repeats are refused when the config is loaded
        return [str(n) for n in cfg.names]
    seen = {resolve(r, t, mapping, rules) for s in SPLITS for r, t in zip(column(dd[s], "label"), column(dd[s], "text"))}
    return sorted(seen - {MISSING})


def _unknown_error(bad: dict[str, list[str]], names: list[str]) -> ValueError:
    counts = ", ".join(f"{v!r} ({len(ids)} rows, e.g. ids {ids[:3]})" for v, ids in sorted(bad.items(), key=lambda x: -len(x[1])))
    return ValueError(
        f"labels outside the classes {names}: {counts}. Map them with label.mapping, add them to label.names, "
        f"add label.rules for unlabelled text, or set label.unknown=drop to drop and count them"
    )


def label(dd, cfg: LabelConfig, ctx: StageContext) -> StageResult:
    """DatasetDict with string `label` -> int ClassLabel `label`; unknown labels fail or are dropped."""
    from datasets import ClassLabel, DatasetDict

    mapping = {str(k): str(v) for k, v in cfg.mapping.items()}
    rules = compile_rules(cfg.rules)
    names = class_names(dd, cfg, mapping, rules)
    if not names:
        raise ValueError("no labels found: the source has no label column values and no label.rules matched")
    index = {n: i for i, n in enumerate(names)}
    bad: dict[str, list[str]] = defaultdict(list)
    found: Counter = Counter()
    for s in SPLITS:
        for doc_id, raw, text in zip(column(dd[s], "id"), column(dd[s], "label"), column(dd[s], "text")):
            name = resolve(raw, text, mapping, rules)
            found[name] += 1
            if name not in index:
                bad[name].append(doc_id)
    if bad and cfg.unknown == "error":
        raise _unknown_error(bad, names)
    absent = [n for n in names if not found[n]]
    if absent:  # an empty class folder, a typo; a warning, not an error: source.max_rows on a sorted file does it too
        print(f"warning: label.names lists {absent} but no document has that label: the model gets a class it never "
              f"sees (found: {dict(sorted(found.items()))})", file=sys.stderr)

    def to_id(batch):
        ids = [index.get(resolve(r, t, mapping, rules), -1) for r, t in zip(batch["label"], batch["text"])]
        return {"label": ids}

    out = {}
    for s in SPLITS:
        # an empty split is built with the final feature: cast_column does nothing on zero rows
        mapped = ctx.engine.map_batches(dd[s], to_id, {"label": ClassLabel(names=names)}, desc=f"label {s}")
        kept = mapped.filter(lambda b: [i >= 0 for i in b["label"]], batched=True, desc=f"unknown labels {s}")
        out[s] = kept.cast_column("label", ClassLabel(names=names))
    dropped = {"unknown_label": sum(len(v) for k, v in bad.items() if k != MISSING), "missing_label": len(bad.get(MISSING, []))}
    result = DatasetDict(out)
    counts = {s: dict(Counter(names[i] for i in column(result[s], "label"))) for s in SPLITS}
    stats = {"label_names": names, "class_counts": counts, "classes_without_documents": absent}
    return StageResult(result, {k: v for k, v in dropped.items() if v}, stats)
