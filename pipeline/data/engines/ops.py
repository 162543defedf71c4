"""Dataset helpers that stages and engines share: row counts, columns as lists, a row's sampling
hash, the combining of a reduce's partials, and a `map` that keeps its columns on empty splits."""

from __future__ import annotations

import hashlib
from typing import Any

SPLITS = ("train", "validation", "test")
TEXT = "text"  # the column a document's text is in, from load on: source.text_field's values go there


def num_rows(data: Any) -> int:
    """Rows of a Dataset, or summed over the splits of a DatasetDict."""
    if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
        return data.num_rows
    return sum(d.num_rows for d in data.values())


def column(ds: Any, name: str) -> list:
    """A column as a Python list. `ds[name]` alone is a lazy Column in datasets>=4, and indexing it
    row by row costs a table lookup per row (seconds for a few thousand rows)."""
    return ds[name][:]


def unit_hash(seed: int, doc_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, id): a document's place in every sampling decision."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def add_up(partials: list) -> Any:
    """Partials of a reduce added up in order: numbers, Counters (first-seen key order kept), sets
    (united) and tuples of them (element by element)."""
    first, *rest = partials
    if isinstance(first, tuple):
        return tuple(add_up(list(parts)) for parts in zip(*partials))
    for p in rest:
        first = first | p if isinstance(first, set) else first + p
    return first


def concat(partials: list) -> Any:
    """Partials of a reduce that are per-row values (numpy arrays, or tuples of them), joined in row order."""
    import numpy as np

    if isinstance(partials[0], tuple):
        return tuple(concat(list(parts)) for parts in zip(*partials))
    return np.concatenate(partials)


def fetch(engine: Any, ds: Any, rows: list[int], names: tuple[str, ...]) -> tuple[list, ...]:
    """Columns `names` of `ds` at `rows` (ascending), one list each, read where `engine` reduces: only
    those rows (`ds.select(rows)`), never the whole column."""
    import functools

    if not len(rows):
        return tuple([] for _ in names)
    return engine.reduce(ds.select(rows), functools.partial(_lists, names=names), add_up, list(names), desc="fetch")


def _lists(table: Any, names: tuple[str, ...]) -> tuple[list, ...]:
    return tuple(table.column(n).to_pylist() for n in names)


def map_batches(ds: Any, fn: Any, added: dict, **kwargs: Any) -> Any:
    """`ds.map(fn, batched=True, ...)` whose result has the same columns when `ds` is empty.

    On zero rows datasets never calls `fn`, so the columns it adds are missing (with
    remove_columns, every column is): an empty split (split.validation=0) would then differ from
    the others and save as a folder that does not load. `added` maps each column `fn` adds or
    changes to its feature, exactly as datasets infers it for rows.
    """
    if ds.num_rows:
        return ds.map(fn, batched=True, **kwargs)
    from datasets import Dataset, Features

    removed = kwargs.get("remove_columns") or []
    features = Features({**{k: v for k, v in ds.features.items() if k not in removed}, **added})
    return Dataset.from_dict({k: [] for k in features}, features=features)
