"""Label stage of regression: each row's raw label parsed to a float32 target, checked against label.scale.

A row whose label is empty is dropped and counted (missing_label); a label that is not a finite number, or
a target outside label.scale, is a one-line error naming the document (label.unknown=drop: dropped and
counted instead). The manifest records the scale (declared or found) and each split's target statistics.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS
from pipeline.schema import LabelConfig

EXAMPLES = 3  # ids an error shows per kind of bad row
FLOAT32_MAX = float(np.finfo(np.float32).max)  # targets are stored as float32: past this they would be infinities


def parse(raw) -> float | None:
    """A raw label's target: None when empty; ValueError when it is not a number finite in float32, the dtype
    the target is stored in (1e39 is finite as a Python float and inf in the prepared data)."""
    text = "" if raw is None else str(raw).strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not a finite number")
    if abs(value) > FLOAT32_MAX:
        raise ValueError(f"{raw!r} is beyond float32's range (±{FLOAT32_MAX:.4g}), the dtype targets are stored in")
    return value


def target(raw, scale: tuple | None) -> float | None:
    """parse(raw), None (the row dropped) when it is missing, not a number or outside `scale`."""
    try:
        value = parse(raw)
    except ValueError:
        return None
    return None if value is None or (scale and not scale[0] <= value <= scale[1]) else value


def _targets(table, scale: tuple | None) -> tuple:
    """One batch's share of the label report: (its valid targets in row order, rows without a label,
    (rows whose label is not a number, the first EXAMPLES (id, label)), (rows outside `scale`, the first
    EXAMPLES (id, target)))."""
    values, missing, bad, outside = [], 0, [0, []], [0, []]
    for doc_id, raw in zip(table.column("id").to_pylist(), table.column("label").to_pylist()):
        try:
            value = parse(raw)
        except ValueError:
            bad[0] += 1
            bad[1] = (bad[1] + [(doc_id, raw)])[:EXAMPLES]
            continue
        if value is None:
            missing += 1
        elif scale and not scale[0] <= value <= scale[1]:
            outside[0] += 1
            outside[1] = (outside[1] + [(doc_id, value)])[:EXAMPLES]
        else:
            values.append(value)
    return np.asarray(values, dtype=np.float64), missing, tuple(bad), tuple(outside)


def _add_targets(partials: list) -> tuple:
    """_targets's partials, in row order, as one."""
    values = np.concatenate([p[0] for p in partials])
    missing = sum(p[1] for p in partials)
    bad, outside = [
        (sum(p[k][0] for p in partials), [x for p in partials for x in p[k][1]][:EXAMPLES]) for k in (2, 3)]
    return values, missing, bad, outside


def describe(values: np.ndarray) -> dict:
    """count, mean, std (population), min and max of a split's targets (None beside a count of 0)."""
    if not len(values):
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"count": int(len(values)), "mean": float(values.mean()), "std": float(values.std()),
            "min": float(values.min()), "max": float(values.max())}


def _errors(per_split: dict, cfg: LabelConfig) -> None:
    """The first kind of bad row found, as one line (label.unknown=error)."""
    for s in SPLITS:
        _, _, (n, first), _ = per_split[s]
        if n:
            doc, raw = first[0]
            raise ValueError(f"label: document {doc!r} has target {raw!r}, not a number finite in "
                             f"float32, the targets' dtype ({n} such rows in {s}, "
                             f"e.g. ids {[d for d, _ in first]}); fix them or set label.unknown=drop to drop them")
    for s in SPLITS:
        _, _, _, (n, first) = per_split[s]
        if n:
            doc, value = first[0]
            raise ValueError(f"label: document {doc!r} has target {value:g}, outside label.scale {list(cfg.scale)} "
                             f"({n} such rows in {s}, e.g. ids {[d for d, _ in first]})")


def _kept(table):
    """A mapped batch's rows with a target (null: dropped)."""
    import pyarrow.compute as pc

    return pc.is_valid(table.column("label"))


def _rows(table) -> int:
    return table.num_rows


def label(dd, cfg: LabelConfig, ctx: StageContext) -> StageResult:
    """DatasetDict with string `label` -> float32 `label`, less the rows without a target."""
    from datasets import DatasetDict, Value

    scale = tuple(float(x) for x in cfg.scale) or None
    fn = functools.partial(_targets, scale=scale)
    per_split = {s: ctx.engine.reduce(dd[s], fn, _add_targets, ["id", "label"], desc=f"targets {s}") for s in SPLITS}
    if cfg.unknown == "error":
        _errors(per_split, cfg)
    values = {s: per_split[s][0] for s in SPLITS}
    found = np.concatenate(list(values.values()))
    if not len(found):
        raise ValueError("label: no targets found: every row's label is empty or not a number")

    def to_target(batch):
        return {"label": [target(raw, scale) for raw in batch["label"]]}

    out, added = {}, {"label": Value("float32")}
    for s in SPLITS:
        if len(values[s]) < dd[s].num_rows:  # rows to drop: the map and the filter in one pass
            kept, _ = ctx.engine.map_filter(dd[s], to_target, added, _kept, drop=[], tally=_rows, combine=sum,
                                            desc=f"label {s}")
        else:
            kept = ctx.engine.map_batches(dd[s], to_target, added, desc=f"label {s}")
        out[s] = kept if kept.features["label"] == Value("float32") else kept.cast_column("label", Value("float32"))
    dropped = {"missing_label": sum(per_split[s][1] for s in SPLITS),
               "unknown_label": sum(per_split[s][2][0] for s in SPLITS),
               "outside_scale": sum(per_split[s][3][0] for s in SPLITS)}
    stats = {"scale": list(scale) if scale else [float(found.min()), float(found.max())],
             "scale_from": "label.scale" if scale else "found",
             "targets": {s: describe(values[s]) for s in SPLITS}}
    return StageResult(DatasetDict(out), {k: v for k, v in dropped.items() if v}, stats)


def check_config(cfg: LabelConfig) -> None:
    """label.scale is empty or [low, high] with low < high; the class keys (names, mapping, rules) are unset."""
    for key in ("names", "mapping", "rules"):
        if getattr(cfg, key):
            raise ValueError(f"label.{key}: task=regression has no classes (its targets are numbers); remove it")
    scale = list(cfg.scale)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                  and abs(x) <= FLOAT32_MAX for x in scale)
    if scale and not (len(scale) == 2 and numbers and scale[0] < scale[1]):
        raise ValueError(f"label.scale: {scale!r} is not [low, high] with two numbers finite in float32 (the "
                         f"targets' dtype), low < high (empty = the range found)")
