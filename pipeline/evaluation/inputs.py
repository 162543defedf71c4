"""New rows for predict.py: a user's file or folder read in parts, each part cleaned, chunked and tokenized as the
run's prepared data was, by prepare's own functions and the run's recorded settings.

A part is what prepare's readers read at once (formats.plan_parts: byte ranges at line starts of a CSV, TSV or
JSONL, row groups of Parquet, files of a label folder), about `part_bytes` of input each, so memory is bounded by a
part, not by the file. Parts are planned from the file's bytes alone, so a rerun plans the same parts: what
resume counts in (predict.py's progress record) is parts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pipeline.data.engines.ops import TEXT
from pipeline.data.io import conversation, formats, pair, parts, readers
from pipeline.data.stages import clean, load, split, tokenize
from pipeline.schema import SourceConfig

SUFFIX_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                  ".yml": "conversations", ".yaml": "conversations"}


def source_for(recorded: SourceConfig, path: Path, overrides: dict) -> SourceConfig:
    """The run's recorded source settings (fields, encoding, pairs, conversations) pointed at `path`: its format from
    its suffix (a folder: label folders) unless given, no label or split column, every row (no max_rows, no sample);
    `overrides`: the user's source.* keys, applied last."""
    fmt = "folder" if path.is_dir() else SUFFIX_FORMATS.get(path.suffix.lower(), recorded.format)
    if path.is_dir() and recorded.format in ("parquet", "conversations"):
        fmt = recorded.format  # a Parquet dataset folder, a folder of YAML conversation files
    base = dataclasses.replace(recorded, path=str(path), package="", format=fmt, label_field="", split_field="",
                               max_rows=0, sample=1.0, hub_config="", hub_splits=[])
    return dataclasses.replace(base, **overrides)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def plan(path: Path, cfg: SourceConfig, part_bytes: int) -> list[parts.Part]:
    """The parts predict.py reads `path` in: about `part_bytes` each, a CSV's moved to record starts (its quotes
    counted, as the Ray engine's round 1a does), or the whole input where a format cannot be cut."""
    if not path.exists():
        raise ValueError(f"--input {path}: no such file or folder")
    n = max(1, -(-_size(path) // max(part_bytes, 1)))
    pieces = formats.plan_parts(path, cfg, n)
    if cfg.format == "csv" and len(pieces) > 1:
        if not parts.parity_applies(cfg):
            return [parts.WHOLE]
        pieces = parts.record_parts(pieces, [parts.quote_facts(path, p.span) for p in pieces], path.stat().st_size)
    return pieces


@dataclass
class Batch:
    """One part's documents, in input order: their ids (the source's id column, else the record's number among the
    input's readable records, from 0), texts as the model saw them, why each was left out ("" = kept: an empty
    text, or what clean drops), and the tokenized chunks of the kept ones (`rows`: the tokenize stage's columns
    plus `doc`, the document's index in this batch)."""

    ids: list
    texts: list[str]
    dropped: list[str]
    rows: dict = field(default_factory=dict)
    bad: int = 0  # records --bad-lines skip skipped in this part (no output row, as prepare drops them)


def read(path: Path, cfg: SourceConfig, part: parts.Part, first_record: int) -> tuple[dict | None, int]:
    """One part's rows as the load stage's string columns (load.string_columns), and the bad records skipped. A
    record without the text field is one line naming the file and record, or (source.bad_lines=skip) skipped and
    counted."""
    import pyarrow.compute as pc

    where = str(path)
    table, facts = formats.read_part(path, cfg, part, lines=cfg.format == "jsonl")
    if facts.error is not None:
        raise ValueError(facts.error[2])
    if facts.quoted:  # the Ray engine reads such a file whole; here the parts are the resume's unit, fixed at the start
        raise ValueError(f"{where}: a quote that the CSV's part planner cannot follow (parts.py); read it as one part "
                         f"with --part-mb larger than the file ({_size(path) / 2**20:.0f} MB)")
    if facts.rows:
        readers.check_columns(list(facts.columns) if facts.lines else list(table.column_names), cfg, where)
    bad = facts.bad
    if table is None or not table.num_rows:
        return None, bad
    missing = table.column(TEXT).is_null()
    if n_missing := pc.sum(missing).as_py() or 0:
        if cfg.bad_lines != "skip":
            at = missing.to_pylist().index(True)
            raise ValueError(f"{where}: record {first_record + at + 1} has no '{cfg.messages_field or cfg.text_field}' "
                             f"field (source.text_field); fix it or pass --bad-lines skip")
        bad += n_missing
        table = table.filter(pc.invert(missing))
    return load.string_columns(table, cfg, where), bad


def prepare_part(cols: dict | None, record: int, run_cfg: Any, source: SourceConfig, encode: Any, bad: int) -> Batch:
    """The part's documents cleaned (clean.clean_texts, the run's clean settings), chunked (split.chunk_text) and
    tokenized (`encode`: tokenize.saved_encoder's batch function)."""
    texts = cols[TEXT].to_pylist() if cols is not None else []
    ids = cols["id"].to_pylist() if cols is not None and "id" in cols else list(range(record, record + len(texts)))
    kept = load.nonempty(cols[TEXT]).to_pylist() if texts else []
    whole = bool(source.text_pair_field) or conversation.conversational(source)  # a pair or conversation: one piece
    cleaned, reasons = clean.clean_texts(texts, run_cfg.clean, conversation.conversational(source), pair.paired(source))
    reasons = [reason if ok else "empty" for reason, ok in zip(reasons, kept)]
    chunks, docs = [], []
    for k, (text, reason) in enumerate(zip(cleaned, reasons)):
        if not reason:
            pieces = [text] if whole else split.chunk_text(text, run_cfg.split)
            chunks += pieces
            docs += [k] * len(pieces)
    rows = encode({TEXT: chunks}) if chunks else {"input_ids": []}
    rows = {k: v for k, v in rows.items() if k != "truncated"}
    return Batch(ids=ids, texts=cleaned, dropped=reasons, rows={**rows, "doc": docs}, bad=bad)


def batches(path: Path, pieces: list, source: SourceConfig, run_cfg: Any, tokenizer_dir: Path,
            start: int = 0, record: int = 0) -> Iterator[Batch]:
    """The Batch of every part of `pieces` (plan's) from `start` on;
    `record`: the records the parts before `start` held (ids of a source without an id column continue from it)."""
    encode = tokenize.saved_encoder(tokenizer_dir, run_cfg.tokenize, bool(pair.paired(source)))
    total = 0
    for k, piece in enumerate(pieces):
        if k < start:
            continue
        cols, bad = read(path, source, piece, record)
        batch = prepare_part(cols, record, run_cfg, source, encode, bad)
        record += len(batch.ids)
        total += len(batch.ids) + bad
        yield batch
    if start == 0 and total == 0:
        raise ValueError(f"{path}: no rows to read (the input holds no records)")

