"""A stratified split of regression data: each row's stratum is its target's quantile bin, so every split
spans the targets' range in the same proportions (a split of only low targets would score nothing real)."""

from __future__ import annotations

import functools

import numpy as np

from pipeline.data.engines.ops import concat
from pipeline.tasks.regression.label import parse

BINS = 10  # quantile bins at most
ROWS_PER_SPLIT = 2  # a bin's rows that its smallest split should get: fewer bins on small data


def _values(table) -> np.ndarray:
    """A batch's targets that parse (float64), in row order; the label stage reports the others."""
    out = []
    for raw in table.column("label").to_pylist():
        try:
            value = parse(raw)
        except ValueError:
            continue
        if value is not None:
            out.append(value)
    return np.asarray(out, dtype=np.float64)


def bins(rows: int, ratios: tuple[float, ...]) -> int:
    """How many quantile bins `rows` targets are cut into: BINS, or fewer, so each bin holds about
    ROWS_PER_SPLIT rows of the smallest non-empty split (a bin smaller than that rounds its rows into train)."""
    smallest = min(r for r in ratios if r > 0)
    return int(max(1, min(BINS, rows * smallest // ROWS_PER_SPLIT)))


def edges(values: np.ndarray, count: int) -> tuple[float, ...]:
    """The inner edges of `count` quantile bins of `values`: targets that occur, ties merged (a target shared by many
    rows is in one bin)."""
    if not len(values) or count < 2:
        return ()
    cuts = np.quantile(values, np.linspace(0, 1, count + 1)[1:-1], method="lower")
    return tuple(float(x) for x in np.unique(cuts))


def stratum(raw, edges: tuple[float, ...]) -> str:
    """A raw label's quantile bin ("00", "01", ...: bin k holds the targets above edge k-1 up to edge k), or ""
    when it is empty or not a number."""
    try:
        value = parse(raw)
    except ValueError:
        return ""
    return "" if value is None else f"{int(np.searchsorted(edges, value, side='left')):02d}"


def strata(cfg, ds, engine) -> functools.partial:
    """Task.strata: the targets of `ds` (its raw `label` column) read through `engine`, cut into quantile bins;
    returns a picklable function from a raw label to its bin."""
    values = engine.reduce(ds, _values, concat, ["label"], desc="target quantiles")
    split = cfg.split
    return functools.partial(stratum, edges=edges(values, bins(len(values), (split.train, split.validation, split.test))))
