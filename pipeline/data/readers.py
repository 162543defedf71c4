"""File readers for the load stage: (path, SourceConfig) -> (pyarrow table, drops by reason).

Each reader returns the contract's column names (text, and label/id/source_split when configured)
with the source's values as strings, and names the file, line and column in every error. Fast
paths are pyarrow's C++ readers; Python line-by-line reading is the fallback that can point at the
exact bad line (JSONL) or runs only after a failure to find it (invalid bytes, CSV rows).
"""

from __future__ import annotations

import codecs
import difflib
import json
import re
import sys
from pathlib import Path

import pyarrow as pa

from pipeline.config import SourceConfig

FOLDER_SPLITS = ("train", "validation", "valid", "val", "dev", "test")
_SURROGATE = re.compile("[\ud800-\udfff]")


def needed_columns(cfg: SourceConfig) -> dict[str, str]:
    """Contract column -> the source's column name, for the configured fields."""
    pairs = {"text": cfg.text_field, "label": cfg.label_field, "id": cfg.id_field, "source_split": cfg.split_field}
    return {ours: theirs for ours, theirs in pairs.items() if theirs}


def check_columns(available: list[str], cfg: SourceConfig, where: str) -> dict[str, str]:
    """The needed columns, or an error listing the columns that exist and the closest match."""
    keys = {"text": "text_field", "label": "label_field", "id": "id_field", "source_split": "split_field"}
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


def check_text_file(path: Path, encoding: str, fmt: str, block: int = 1 << 20) -> None:
    """A text format's file must be text in `encoding`, checked before a parser sees it.

    pyarrow's JSON reader keeps invalid UTF-8 in its strings (found only when a row is read, naming
    no file), and its CSV reader's bad-row callback fails on such a row ("Exception ignored").
    One pass of the C decoder over 1 MB blocks costs ~1 s per GB; a NUL byte means a binary file.
    """
    nul_is_text = encoding.startswith(("utf-16", "utf-32"))
    decoder = codecs.getincrementaldecoder(encoding)()
    offset = lines = 0
    with open(path, "rb") as f:
        while data := f.read(block):
            if not nul_is_text and (at := data.find(b"\0")) >= 0:
                raise ValueError(f"{path}: a NUL byte at offset {offset + at}: this is a binary file, not "
                                 f"{fmt.upper()} text; check source.path and source.format")
            try:
                decoder.decode(data)
            except UnicodeDecodeError:
                raise _bad_bytes_error(path, encoding) from None
            offset, lines = offset + len(data), lines + data.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ValueError(f"{path}:{lines + 1}: the file ends inside a {encoding} character: it is cut short, or not "
                         f"{encoding} (set source.encoding to the file's encoding)") from None


def _pyarrow_message(e: Exception) -> str:
    """pyarrow's parse error without the row it quotes (raw bytes, newlines, any length)."""
    text = str(e)
    found = re.search(r"Expected \d+ columns, got \d+", text)
    return found.group(0) if found else ascii(text.splitlines()[0] if text else "")[1:-1][:200]


def read_csv(path: Path, cfg: SourceConfig) -> tuple[pa.Table, dict]:
    encoding = _codec(cfg)
    check_text_file(path, encoding, cfg.format)
    try:
        return _read_csv(path, cfg, encoding, block_size=None)
    except _RowLongerThanBlock:  # pyarrow parses 1 MB blocks in parallel; a longer row needs bigger ones
        return _read_csv(path, cfg, encoding, block_size=min(path.stat().st_size + 1, 2**31 - 1))


class _RowLongerThanBlock(Exception):
    """pyarrow's "straddling object straddles two block boundaries"."""


def _read_csv(path: Path, cfg: SourceConfig, encoding: str, block_size: int | None) -> tuple[pa.Table, dict]:
    from pyarrow import csv

    read_opts = csv.ReadOptions(encoding="utf8" if encoding == "utf-8" else encoding,
                                **({"block_size": block_size} if block_size else {}))
    bad: list[str] = []

    def on_bad_row(row) -> str:  # pyarrow gives no line number; it is looked up below
        bad.append(row.text)
        return "skip" if cfg.bad_lines == "skip" else "error"

    # TSV has no quoting (IANA text/tab-separated-values): a lone '"' in a tweet must not swallow lines
    dialect = {"delimiter": "\t", "quote_char": False} if cfg.format == "tsv" else {"newlines_in_values": True}
    parse = csv.ParseOptions(**dialect, invalid_row_handler=on_bad_row)
    try:
        peek = csv.ParseOptions(**dialect, invalid_row_handler=lambda _: "skip")
        with csv.open_csv(path, read_options=read_opts, parse_options=peek) as r:  # the header only
            available = r.schema.names
        needed = check_columns(available, cfg, str(path))
        convert = csv.ConvertOptions(include_columns=list(dict.fromkeys(needed.values())),
                                     column_types={c: pa.string() for c in needed.values()})
        table = csv.read_csv(path, read_options=read_opts, parse_options=parse, convert_options=convert)
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
    return select(table, needed), {"bad_line": len(bad)}


def _line_of(path: Path, encoding: str, row_text: str) -> str:
    content = path.read_text(encoding=encoding, errors="replace")
    at = content.find(row_text)
    return str(content.count("\n", 0, at) + 1) if at >= 0 else "?"


def read_jsonl(path: Path, cfg: SourceConfig) -> tuple[pa.Table, dict]:
    check_text_file(path, _codec(cfg), cfg.format)
    if _codec(cfg) == "utf-8":
        from pyarrow import json as pa_json

        try:  # fast path: the whole file parsed in C++; any problem falls back to the line reader
            table = pa_json.read_json(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return read_jsonl_lines(path, cfg)
        if not table.num_rows:  # blank lines only: no columns to check, and nothing to read
            return read_jsonl_lines(path, cfg)
        table = select(table, check_columns(table.column_names, cfg, str(path)))
        try:  # a number is text "1"; an object or list is not text: the line reader names its line
            return table.cast(pa.schema([(n, pa.string()) for n in table.column_names])), {}
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return read_jsonl_lines(path, cfg)


def read_jsonl_lines(path: Path, cfg: SourceConfig) -> tuple[pa.Table, dict]:
    """The line reader: exact line numbers for bad lines and bad bytes, skip-and-count if configured."""
    encoding = _codec(cfg)
    fields = needed_columns(cfg)
    values: dict[str, list] = {ours: [] for ours in fields}
    keys_seen: dict[str, None] = {}
    bad = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if cfg.max_rows and len(values["text"]) >= cfg.max_rows:
                break
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: bytes {raw[e.start:e.end]!r} at column {e.start + 1} are not "
                                 f"valid {encoding}; set source.encoding to the file's encoding") from None
            if lineno == 1:
                line = line.lstrip("\ufeff")  # a byte-order mark is not part of the first record
            if not line.strip():
                continue
            try:
                row = _parse_record(line, fields)
            except ValueError as e:
                if cfg.bad_lines == "error":
                    raise ValueError(f"{path}:{lineno}: {e}; fix the line or set source.bad_lines=skip") from None
                bad += 1
                continue
            keys_seen.update(dict.fromkeys(row.pop(None)))
            for ours in fields:
                values[ours].append(row[ours])
    if values["text"] or keys_seen:
        check_columns(list(keys_seen), cfg, str(path))
    return pa.table({ours: pa.array(vals, pa.string()) for ours, vals in values.items()}), {"bad_line": bad}


def _parse_record(line: str, fields: dict[str, str]) -> dict:
    """One JSON object -> {contract column: str or None, None: the object's keys}."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    row: dict = {None: obj.keys()}
    for ours, theirs in fields.items():
        v = obj.get(theirs)
        if isinstance(v, (dict, list)):
            raise ValueError(f"field '{theirs}' holds a JSON {type(v).__name__}, expected text")
        if isinstance(v, str):  # a lone surrogate (\ud83d) cannot be stored as UTF-8: make it U+FFFD
            v = _SURROGATE.sub("\ufffd", v)
        elif v is not None:
            v = json.dumps(v)
        row[ours] = v
    return row


def read_parquet(path: Path, cfg: SourceConfig) -> tuple[pa.Table, dict]:
    import pyarrow.dataset as pads

    try:
        data = pads.dataset(path, format="parquet")
        needed = check_columns(data.schema.names, cfg, str(path))
        table = data.to_table(columns=list(dict.fromkeys(needed.values())))
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot read as Parquet: {_pyarrow_message(e)}") from None
    return select(table, needed), {}


def read_folder(path: Path, cfg: SourceConfig) -> tuple[pa.Table, dict]:
    """root/<label>/*.txt, or root/<split>/<label>/*.txt (the IMDB release); id = relative path."""
    if not path.is_dir():
        raise ValueError(f"source.path: {path} is a file; format=folder expects a folder of <label>/*.txt")
    split_dirs = [d for d in _subfolders(path) if d.name.lower() in FOLDER_SPLITS]
    files = []  # (split, label, file)
    for split_dir in split_dirs or [path]:
        for label_dir in _subfolders(split_dir):
            found = sorted(label_dir.glob("*.txt"))
            if not found:  # a class that silently vanished would only show up as a worse model
                print(f"warning: {label_dir} has no .txt files: class '{_name(label_dir.name)}' gets no documents "
                      f"from it", file=sys.stderr)
            files += [(split_dir.name if split_dirs else "", label_dir.name, f) for f in found]
    if not files:
        raise ValueError(f"source.path: {path} has no <label>/*.txt files; expected root/<label>/*.txt "
                         f"or root/{{train,test}}/<label>/*.txt")
    if cfg.max_rows > 0:
        files = files[: cfg.max_rows]
    encoding = _codec(cfg)
    texts = [_read_text(f, encoding) for _, _, f in files]
    return pa.table({
        "id": [_name(f.relative_to(path).as_posix()) for _, _, f in files],
        "text": texts,
        "label": [_name(label) for _, label, _ in files],
        "source_split": [split for split, _, _ in files],
    }), {}


def _subfolders(path: Path) -> list[Path]:
    """Visible subfolders: `.ipynb_checkpoints` or `.git` is no class."""
    return [d for d in sorted(path.iterdir()) if d.is_dir() and not d.name.startswith(".")]


def _name(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (Python's lone surrogates, which Arrow cannot
    store) become \\xNN escapes, so ids stay unique and readable."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _read_text(path: Path, encoding: str) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: bytes {raw[e.start:e.end]!r} are not valid {encoding}; "
                         f"set source.encoding to the files' encoding") from None


READERS = {"jsonl": read_jsonl, "csv": read_csv, "tsv": read_csv, "parquet": read_parquet, "folder": read_folder}
