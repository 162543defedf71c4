"""File readers for the load stage: (path, SourceConfig, part) -> (pyarrow table, Facts).

A part (parts.py) is the whole source for the local engine, a piece of it for a Ray task; the
reader is the same. Errors a later part may hold (bad bytes, a bad line) come back in the Facts,
not raised, so load.settle can raise the one a single read of the whole file meets first.
Each reader returns the contract's column names (text, and label/id/source_split when configured)
with the source's values as strings, and names the file, line and column in every error. Fast
paths are pyarrow's C++ readers; Python line-by-line reading is the fallback that can point at the
exact bad line (JSONL) or runs only after a failure to find it (invalid bytes, CSV rows).
"""

from __future__ import annotations

import codecs
import difflib
import io
import json
import re
from pathlib import Path

import pyarrow as pa

from pipeline.data.engines.ops import TEXT
from pipeline.data.io import conversation, folders, parts
from pipeline.data.io.jsonl import json_object
from pipeline.data.io.parts import WHOLE, Facts, Part
from pipeline.schema import SourceConfig

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` as UTF-8 can store it: a lone surrogate (a JSON or YAML escape like \\ud83d, half of a pair) becomes
    U+FFFD, as a decoder makes of a bad byte."""
    return _SURROGATE.sub("\ufffd", text)


PROMPT = "prompt"  # source.prompt_field's values, until load.finish_rows makes them and the completions one conversation
PAIR = "text_pair"  # source.text_pair_field's values, until load.finish_rows makes them and the texts one pair
LABEL_LIST = "\x1f"  # a raw label that is a list is its items joined by this, as one text (label_list)


def needed_columns(cfg: SourceConfig) -> dict[str, str]:
    """Contract column -> the source's column name, for the configured fields."""
    pairs = {TEXT: cfg.messages_field or cfg.text_field, PROMPT: cfg.prompt_field, PAIR: cfg.text_pair_field,
             "label": cfg.label_field,
             "id": cfg.id_field, "source_split": cfg.split_field}
    return {ours: theirs for ours, theirs in pairs.items() if theirs}


def check_columns(available: list[str], cfg: SourceConfig, where: str) -> dict[str, str]:
    """The needed columns, or an error listing the columns that exist and the closest match."""
    keys = {TEXT: "messages_field" if cfg.messages_field else "text_field", PROMPT: "prompt_field",
            PAIR: "text_pair_field", "label": "label_field", "id": "id_field", "source_split": "split_field"}
    needed = needed_columns(cfg)
    for ours, theirs in needed.items():
        if available.count(theirs) > 1:  # pyarrow would silently take one of them
            raise ValueError(f"{where}: the header names column '{theirs}' (source.{keys[ours]}) "
                             f"{available.count(theirs)} times; rename all but one")
        if theirs not in available:
            close = difflib.get_close_matches(theirs, available, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            extra = " (set source.label_field: '' for unlabelled text)" if ours == "label" else ""
            if len(available) == 1 and (sep := re.search(r"[;|\t]", available[0])):
                extra += (f" (one column: is the file separated by {sep.group()!r}? source.format=csv reads ',', "
                          f"tsv reads tabs)")
            raise ValueError(f"{where}: no column '{theirs}' (source.{keys[ours]}); columns in the file: "
                             f"{', '.join(available) or 'none'}{hint}{extra}")
    return needed


def select(table: pa.Table, needed: dict[str, str]) -> pa.Table:
    return pa.table([table.column(theirs) for theirs in needed.values()], names=list(needed))


# ---------------------------------------------------------------- readers: (path, cfg) -> (table, dropped)


def _codec(cfg: SourceConfig) -> str:
    try:
        return codecs.lookup(cfg.encoding).name
    except LookupError:
        raise ValueError(f"source.encoding: '{cfg.encoding}' is not a known text encoding (e.g. utf-8, latin-1)") from None


def _bad_bytes_error(path: Path, encoding: str) -> ValueError:
    """Find the first line whose bytes are not valid in `encoding` (run only after a failed read)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                decoder.decode(raw)
            except UnicodeDecodeError as e:
                return ValueError(
                    f"{path}:{lineno}: bytes {raw[e.start:e.end]!r} at column {e.start + 1} are not valid {encoding}; "
                    f"set source.encoding to the file's encoding (e.g. latin-1 or cp1252) or re-save it as UTF-8"
                )
    return ValueError(f"{path}: not valid {encoding} text; set source.encoding to the file's encoding")


def check_text_file(path: Path, encoding: str, fmt: str, block: int = 1 << 20, span: tuple | None = None) -> None:
    """A text format's file (or its bytes `span`, cut at line starts) must be text in `encoding`,
    checked before a parser sees it.

    pyarrow's JSON reader keeps invalid UTF-8 in its strings (found only when a row is read, naming
    no file), and its CSV reader's bad-row callback fails on such a row ("Exception ignored").
    One pass of the C decoder over 1 MB blocks costs ~1 s per GB; a NUL byte means a binary file.
    """
    nul_is_text = encoding.startswith(("utf-16", "utf-32"))
    decoder = codecs.getincrementaldecoder(encoding)()
    start, end = span or (0, None)
    offset, lines = start, 0
    with open(path, "rb") as f:
        f.seek(start)
        while data := f.read(block if end is None else min(block, end - offset)):
            if not nul_is_text and (at := data.find(b"\0")) >= 0:
                raise ValueError(f"{path}: a NUL byte at offset {offset + at}: this is a binary file, not "
                                 f"{fmt.upper()} text; check source.path and source.format")
            try:
                decoder.decode(data)
            except UnicodeDecodeError:
                raise _bad_bytes_error(path, encoding) from None
            offset, lines = offset + len(data), lines + data.count(b"\n")
        last = not f.read(1)
    try:
        decoder.decode(b"", final=last)
    except UnicodeDecodeError:
        lines += _newlines_before(path, start)
        raise ValueError(f"{path}:{lines + 1}: the file ends inside a {encoding} character: it is cut short, or not "
                         f"{encoding} (set source.encoding to the file's encoding)") from None


def _newlines_before(path: Path, offset: int, block: int = 1 << 20) -> int:
    """Line breaks in the file's first `offset` bytes (a part's first line is this + 1; error paths only)."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0 and (data := f.read(min(block, offset))):
            count, offset = count + data.count(b"\n"), offset - len(data)
    return count


def _span_bytes(path: Path, span: tuple) -> bytes:
    with open(path, "rb") as f:
        f.seek(span[0])
        return f.read(span[1] - span[0])


def _pyarrow_message(e: Exception) -> str:
    """pyarrow's parse error without the row it quotes (raw bytes, newlines, any length)."""
    text = str(e)
    found = re.search(r"Expected \d+ columns, got \d+", text)
    return found.group(0) if found else ascii(text.splitlines()[0] if text else "")[1:-1][:200]


def read_csv(path: Path, cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table | None, Facts]:
    """CSV or TSV; a part of it (`part.span`) is read with the file's header line put before it."""
    encoding = _codec(cfg)
    try:
        check_text_file(path, encoding, cfg.format, span=part.span)
    except ValueError as e:
        return None, Facts(error=(0, None, str(e)))
    data = None
    if part.span is not None:
        data = _span_bytes(path, part.span)
        if part.span[0] > 0:  # the header record before the part's records
            header = _span_bytes(path, part.header) if part.header else _first_line(path)
            data = header + data
        if cfg.format == "csv" and b'"' in data and not parts.whole_records(data, cfg, part):
            return None, Facts(quoted=True)  # a quoted value may hold a line break: read as one part
    try:
        table, bad = _read_csv(path, cfg, encoding, None, data)
    except _RowLongerThanBlock:  # pyarrow parses 1 MB blocks in parallel; a longer row needs bigger ones
        size = len(data) if data is not None else path.stat().st_size
        table, bad = _read_csv(path, cfg, encoding, min(size + 1, 2**31 - 1), data)
    return table, Facts(rows=table.num_rows, bad=bad)


def _first_line(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.readline()


def csv_dialect(cfg: SourceConfig) -> dict:
    """pyarrow's ParseOptions of CSV and TSV (parts.parity_applies reads them to know whether quote
    parity finds the records). TSV has no quoting (IANA text/tab-separated-values): a lone '"' in a
    tweet must not swallow lines."""
    return {"delimiter": "\t", "quote_char": False} if cfg.format == "tsv" else {"newlines_in_values": True}


class _RowLongerThanBlock(Exception):
    """pyarrow's "straddling object straddles two block boundaries"."""


def _read_csv(path: Path, cfg: SourceConfig, encoding: str, block_size: int | None,
              data: bytes | None = None) -> tuple[pa.Table, int]:
    from pyarrow import csv

    read_opts = csv.ReadOptions(encoding="utf8" if encoding == "utf-8" else encoding,
                                **({"block_size": block_size} if block_size else {}))
    source = (lambda: path) if data is None else (lambda: pa.BufferReader(data))
    bad: list[str] = []

    def on_bad_row(row) -> str:  # pyarrow gives no line number; it is looked up below
        bad.append(row.text)
        return "skip" if cfg.bad_lines == "skip" else "error"

    dialect = csv_dialect(cfg)
    parse = csv.ParseOptions(**dialect, invalid_row_handler=on_bad_row)
    try:
        peek = csv.ParseOptions(**dialect, invalid_row_handler=lambda _: "skip")
        with csv.open_csv(source(), read_options=read_opts, parse_options=peek) as r:  # the header only
            available = r.schema.names
        needed = check_columns(available, cfg, str(path))
        convert = csv.ConvertOptions(include_columns=list(dict.fromkeys(needed.values())),
                                     column_types={c: pa.string() for c in needed.values()})
        table = csv.read_csv(source(), read_options=read_opts, parse_options=parse, convert_options=convert)
    except UnicodeDecodeError:
        raise _bad_bytes_error(path, encoding) from None
    except pa.ArrowInvalid as e:
        if "straddl" in str(e) and block_size is None:
            raise _RowLongerThanBlock() from None
        if "UTF8" in str(e):
            raise _bad_bytes_error(path, encoding) from None
        if bad:
            raise ValueError(f"{path}:{_line_of(path, encoding, bad[0])}: {_pyarrow_message(e)}; fix the row or set "
                             f"source.bad_lines=skip") from None
        raise ValueError(f"{path}: cannot read as {cfg.format.upper()}: {_pyarrow_message(e)}") from None
    return select(table, needed), len(bad)


def _line_of(path: Path, encoding: str, row_text: str) -> str:
    content = path.read_text(encoding=encoding, errors="replace")
    at = content.find(row_text)
    return str(content.count("\n", 0, at) + 1) if at >= 0 else "?"


def read_jsonl(path: Path, cfg: SourceConfig, part: Part = WHOLE, lines: bool = False) -> tuple[pa.Table | None, Facts]:
    """JSONL: pyarrow's parser, else (or with `lines`) the line reader. The columns are checked by
    load.settle, on what every part found, as one read of the whole file checks them."""
    try:
        check_text_file(path, _codec(cfg), cfg.format, span=part.span)
    except ValueError as e:
        return None, Facts(error=(0, None, str(e)))
    if _codec(cfg) != "utf-8" or lines:
        return read_jsonl_lines(path, cfg, part)
    from pyarrow import json as pa_json

    try:  # fast path: the whole part parsed in C++; any problem falls back to the line reader
        table = pa_json.read_json(path if part.span is None else pa.BufferReader(_span_bytes(path, part.span)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return read_jsonl_lines(path, cfg, part)
    if not table.num_rows:  # blank lines only: no columns to check, and nothing to read
        return read_jsonl_lines(path, cfg, part)
    parsed = {"parsed": table.column_names, "kinds": {c: _kind(table.column(c).type) for c in table.column_names}}
    needed = {ours: theirs for ours, theirs in needed_columns(cfg).items() if theirs in table.column_names}
    table = select(table, needed)
    try:  # a number is text "1"; an object or list is not text: the line reader names its line
        table = table.cast(pa.schema([(n, pa.string()) for n in table.column_names]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        rows, facts = read_jsonl_lines(path, cfg, part)
        facts.parsed, facts.kinds = parsed["parsed"], parsed["kinds"]
        return rows, facts
    for ours in needed_columns(cfg):  # a field this part never names (settle checks the file has it)
        if ours not in table.column_names:
            table = table.append_column(ours, pa.nulls(table.num_rows, pa.string()))
    return table, Facts(rows=table.num_rows, **parsed)


def _kind(tp: pa.DataType) -> str:
    """What pyarrow's JSON parser made of a column, as far as two parts read apart can disagree: ints
    and floats are one kind (the parser widens one to the other), null agrees with everything."""
    if pa.types.is_integer(tp) or pa.types.is_floating(tp):
        return "number"
    return "" if pa.types.is_null(tp) else str(tp)


def read_jsonl_lines(path: Path, cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table, Facts]:
    """The line reader: exact line numbers for bad lines and bad bytes, skip-and-count if configured."""
    encoding = _codec(cfg)
    fields = needed_columns(cfg)
    values: dict[str, list] = {ours: [] for ours in fields}
    facts = Facts(lines=True, bad_at=[])
    start = part.span[0] if part.span else 0
    for k, raw in enumerate(_raw_lines(path, part.span)):
        n = len(values[TEXT])
        if cfg.max_rows and n >= cfg.max_rows:
            break
        try:
            line = raw.decode(encoding)
            if k == 0 and start == 0:
                line = line.lstrip("\ufeff")  # a byte-order mark is not part of the first record
            if not line.strip():
                continue
            row = _parse_record(line, fields, bool(cfg.messages_field))
        except (UnicodeDecodeError, ValueError) as e:
            where = f"{path}:{_newlines_before(path, start) + k + 1 if start else k + 1}"
            if isinstance(e, UnicodeDecodeError):
                facts.error = (1, n, f"{where}: bytes {raw[e.start:e.end]!r} at column {e.start + 1} are not "
                                     f"valid {encoding}; set source.encoding to the file's encoding")
                break
            if cfg.bad_lines == "error":
                facts.error = (1, n, f"{where}: {e}; fix the line or set source.bad_lines=skip")
                break
            facts.bad_at.append(n)
            continue
        for key in row.pop(None):
            facts.columns.setdefault(key, n)
        for ours in fields:
            values[ours].append(row[ours])
    facts.rows, facts.bad = len(values[TEXT]), len(facts.bad_at)
    return pa.table({ours: pa.array(vals, pa.string()) for ours, vals in values.items()}), facts


def _raw_lines(path: Path, span: tuple | None):
    """The file's lines as bytes (with their line breaks), or those of bytes `span`."""
    if span is not None:
        yield from io.BytesIO(_span_bytes(path, span))
        return
    with open(path, "rb") as f:
        yield from f


def _parse_record(line: str, fields: dict[str, str], messages: bool = False) -> dict:
    """One JSON object -> {contract column: str or None, None: the object's keys}."""
    obj = json_object(line)
    row: dict = {None: obj.keys()}
    for ours, theirs in fields.items():
        v = obj.get(theirs)
        if ours == TEXT and messages and v is not None:  # source.messages_field: a list of {role, content}
            try:
                v = conversation.encode(v)
            except ValueError as e:
                raise ValueError(f"field '{theirs}': {e}") from None
        elif ours == "label" and isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v):
            v = label_list(v)
        elif isinstance(v, (dict, list)):
            raise ValueError(f"field '{theirs}' holds a JSON {type(v).__name__}, expected text")
        if isinstance(v, str):
            v = storable(v)
        elif v is not None:
            v = json.dumps(v)
        row[ours] = v
    return row


def label_list(values: list) -> str:
    """A raw label that is a list, as the load stage stores every raw label: one text, its items joined by
    LABEL_LIST (None items left out). Every reader of a format with lists (JSONL, Parquet, the hub) stores them
    so; a task whose labels are lists splits them again in its label stage."""
    return LABEL_LIST.join(x if isinstance(x, str) else json.dumps(x) for x in values if x is not None)


def label_lists(values: list) -> pa.Array:
    """A column of list labels (None for a row without one) as texts (label_list)."""
    return pa.array([None if v is None else label_list(v) for v in values], pa.string())


def read_parquet(path: Path, cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table, Facts]:
    """A Parquet file or folder of files (one dataset, one schema), or some of its row groups."""
    import pyarrow.dataset as pads

    try:
        data = pads.dataset(path, format="parquet")
        needed = check_columns(data.schema.names, cfg, str(path))
        columns = list(dict.fromkeys(needed.values()))
        if part.groups is None:
            table = data.to_table(columns=columns)
        else:
            fragments = {f.path: f for f in data.get_fragments()}
            table = pa.concat_tables([fragments[file].subset(row_group_ids=[group]).to_table(
                schema=data.schema, columns=columns) for file, group in part.groups])
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot read as Parquet: {_pyarrow_message(e)}") from None
    return select(table, needed), Facts(rows=table.num_rows)


read_folder = folders.read_folder  # the label-folder reader lives in folders.py
READERS = {"jsonl": read_jsonl, "csv": read_csv, "tsv": read_csv, "parquet": read_parquet, "folder": read_folder}
