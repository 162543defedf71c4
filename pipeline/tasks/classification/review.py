"""label.review_file: the labels a user reviewed (after a label audit, docs/label-audit.md), read by the label stage.

A row names a document id and what it becomes: a class name (relabel) or `drop`. Every row of that id (a chunked
document's chunks, in whichever split) takes it. Nothing changes without this file, and its bytes are part of the
label stage's fingerprint (fingerprint below), so an edited review file makes a new stage folder, never a stale
cache. A bad row (no id, an id that no document has, a label that is no class) is one line naming the file and row.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

from pipeline import artifacts
from pipeline.data.engines.ops import TEXT
from pipeline.data.io.jsonl import json_object

DROP = "drop"  # the label that removes a document instead of relabelling it


def fingerprint(path: str) -> str:
    """The review file's content (what the label stage's fingerprint takes); a missing file is read's error."""
    return artifacts.file_sha256(path) if Path(path).is_file() else f"missing:{path}"


def _records(path: Path) -> list[tuple[str, dict]]:
    """(where, the row as a dict) of a .csv (a header with id and label) or .jsonl file."""
    if path.suffix == ".jsonl":
        out = []
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append((f"{path}:{k}", json_object(line)))
                    except ValueError as e:
                        raise ValueError(f"label.review_file {path}:{k}: {e}") from None
        return out
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = {"id", "label"} - set(reader.fieldnames or [])
            if missing:
                raise ValueError(f"label.review_file {path}: the header has no {', '.join(sorted(missing))} column "
                                 f"(it needs id,label)")
            return [(f"{path}:{k}", row) for k, row in enumerate(reader, 2)]  # line 1 is the header
    raise ValueError(f"label.review_file {path}: use a .csv (columns id,label) or a .jsonl file")


def read(path: str) -> dict[str, tuple[str, str]]:
    """id -> (class name or DROP, where: file:line). A row without an id or label, or an id listed twice with
    different labels, is a ValueError naming the row."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"label.review_file: {path} does not exist")
    out: dict[str, tuple[str, str]] = {}
    for where, row in _records(p):
        doc, label = str(row.get("id") or "").strip(), str(row.get("label") or "").strip()
        if not doc or not label:
            raise ValueError(f"label.review_file {where}: a row needs an id and a label (a class name or '{DROP}'), "
                             f"got {dict(row)!r}")
        if doc in out and out[doc][0] != label:
            raise ValueError(f"label.review_file {where}: id {doc!r} is listed again with another label "
                             f"({label!r}; {out[doc][1]} says {out[doc][0]!r})")
        out.setdefault(doc, (label, where))
    return out


def check_labels(reviews: dict, names: list[str]) -> None:
    """Every reviewed label is a class or DROP; else one line naming the file and row."""
    for doc, (label, where) in reviews.items():
        if label != DROP and label not in names:
            raise ValueError(f"label.review_file {where}: label {label!r} of id {doc!r} is not a class "
                             f"({', '.join(names)}) nor '{DROP}'")


def _present(table, ids: frozenset, name_of) -> dict[str, list]:
    """id -> [rows, its class name before the review] of the reviewed ids in one batch."""
    out: dict[str, list] = {}
    for doc, raw, text in zip(*(table.column(c).to_pylist() for c in ("id", "label", TEXT))):
        if doc in ids:
            out.setdefault(doc, [0, name_of(raw, text)])[0] += 1
    return out


def _add(parts: list) -> dict[str, list]:
    total: dict[str, list] = {}
    for part in parts:
        for doc, (n, name) in part.items():
            total.setdefault(doc, [0, name])[0] += n
    return total


def rows_per_split(dd, engine, reviews: dict, splits, name_of) -> dict[str, dict[str, list]]:
    """Per split, id -> [rows, class name before the review (name_of(raw label, text))] of each reviewed id found
    there (engine.reduce: on Ray, per block); an id found in no split is one line naming its row."""
    fn = functools.partial(_present, ids=frozenset(reviews), name_of=name_of)
    found = {s: engine.reduce(dd[s], fn, _add, ["id", "label", TEXT], desc=f"review {s}") for s in splits}
    for doc, (_, where) in reviews.items():
        if not any(doc in found[s] for s in splits):
            raise ValueError(f"label.review_file {where}: id {doc!r} is no document of the prepared data (after clean, "
                             f"dedup and split); remove the row")
    return found
