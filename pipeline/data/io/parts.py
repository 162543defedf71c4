"""The pieces a source is read in: the local engine reads one (the whole source), the Ray engine
one per task (engine_ray.RayEngine.load_source), with the same readers (readers.py) and the same
rules for what the pieces add up to (load.settle).

How each format is cut (`plan_parts`), always into contiguous pieces in file order:
- JSONL and TSV: byte ranges cut at line starts (a line is a record: TSV has no quoting), when the
  encoding is UTF-8 or one byte per character (elsewhere a b"\\n" byte may sit inside a character:
  one part); a bad line keeps its real line number (the part counts the lines before it, on error).
- CSV: the same line-start ranges, then moved to record starts (`record_parts`): a quoted value may
  hold a line break (`newlines_in_values`), so a line start need not be a record start. The reader's
  dialect (csv_dialect: quote char `"`, quotes doubled inside a quoted value, no escape
  character) is RFC 4180's, where a byte lies inside a quoted value iff an odd number of quote bytes
  precede it. So a first round of tasks counts each range's quote bytes and finds its first line start
  at even and at odd parity (`quote_facts`); the driver adds the counts' parities up (O(parts)) and
  moves each cut to the first line start at even parity in the file; each part then reads the records
  between two such starts, the header record put before them. The rule holds only for quotes where
  pyarrow's parser takes them as RFC 4180 does: a quote opening a value at the value's start, a
  closing one followed by a delimiter, a line break, a quote (doubled) or the end. A part checks
  that for its quotes (`parity_holds`); a quote elsewhere (`x"y`, `"a"b`: a literal quote in pyarrow's
  parse, a toggle in the count), a dialect the count cannot see (an escape character, another quote
  character: `parity_applies`), or an encoding whose quote, comma or line break bytes are not ASCII's,
  and the whole file is read as one part (Facts.quoted: one task per file, the honest fallback). A bad
  record's line is found as the local reader finds it (its text searched in the whole file).
- Parquet: row groups, in the dataset's fragment order. Label folders: the files, listed here (on
  the driver), in their sorted order.
- Hub: the driver calls datasets.load_dataset (the download: it writes each split's Arrow files into
  the HF datasets cache, download_and_prepare) and cuts each split's rows into ranges; a part is
  (split, its cache files, the memory-mapped split pickled: file names and slices, row range), read by
  a task from those files (hub.read_hub). A split that is not memory-mapped (held in memory by
  the builder, or with an indices mapping) makes the plan [WHOLE]: the Ray engine then reads the
  dataset on the driver as the local engine does (ray_load._read).
The planning and reading of parts by format is formats.py's; this module holds what a part is and
the byte-level rules of cutting one (it imports no reader).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.schema import SourceConfig

MAX_PART_BYTES = 256 * 2**20  # a part is held by its task whole (pyarrow's parsers read it in one piece)
SCAN_BYTES = 16 * 2**20  # quote_facts reads a range in blocks of this (its arrays: ~9 B per quote or line break)
QUOTE, CR, LF = 0x22, 0x0D, 0x0A


@dataclass(frozen=True)
class Part:
    """What one reader call reads (plan_parts plans them): bytes [start, end) of a text file
    cut at line starts, row groups (file, id) of Parquet, files (split, label, path) of a label
    folder, rows (split, cache files, the split's Dataset pickled, start, end) of a hub dataset;
    None: all of it (the local engine reads the whole source as one part). `header`: the bytes
    [0, end) of a CSV's header record, set when `span` was moved to record starts (record_parts)."""

    span: tuple | None = None
    groups: tuple | None = None
    files: tuple | None = None
    rows: tuple | None = None
    header: tuple | None = None


WHOLE = Part()


@dataclass
class Facts:
    """What a reader says about its part besides the rows, so that parts add up to one read of the
    whole source (load.settle): errors are returned, not raised, and applied in file order."""

    rows: int = 0  # records read
    bad: int = 0  # bad lines skipped
    bad_at: list | None = None  # JSONL line reader: the records read before each skipped line (max_rows)
    error: tuple | None = None  # (rank: 0 = the file's bytes, 1 = a record or the columns; records before it
    # or None when max_rows does not stop it; the one-line message)
    columns: dict = field(default_factory=dict)  # JSONL line reader: key -> records before its first use
    parsed: list | None = None  # JSONL: the columns pyarrow's parser found (None: it failed or was not tried)
    kinds: dict = field(default_factory=dict)  # JSONL: column -> the kind pyarrow inferred
    lines: bool = False  # JSONL: the rows come from the line reader
    quoted: bool = False  # CSV: a quote character in the part, so it cannot be read apart from the file


def runs(items: list, n: int) -> list[list]:
    """`items` in at most `n` contiguous, near-equal, non-empty runs."""
    n = max(1, min(n, len(items)))
    return [items[len(items) * k // n: len(items) * (k + 1) // n] for k in range(n)]


def cuttable(encoding: str) -> bool:
    """Is every b"\\n" byte a line break, and the byte after it a character's start? UTF-8, and the
    codecs of one byte per character (latin-1, cp1252, ...), yes; UTF-16/32 or stateful ones, no."""
    if encoding == "utf-8":
        return True
    try:
        return len(bytes(range(256)).decode(encoding, errors="replace")) == 256 and "\n".encode(encoding) == b"\n"
    except (LookupError, UnicodeError):
        return False


def line_starts(path: Path, offsets: list[int]) -> list[int]:
    """For each byte offset, the start of the first line that begins after it (reads one partial line)."""
    starts = []
    with open(path, "rb") as f:
        for offset in offsets:
            f.seek(max(0, offset - 1))
            f.readline()  # the rest of the line holding byte offset-1: the next line starts at a record
            starts.append(f.tell())
    return starts


# ---------------------------------------------------------------- the source's encoding and CSV dialect


def codec_of(cfg: SourceConfig) -> str:
    try:
        return codecs.lookup(cfg.encoding).name
    except LookupError:
        raise ValueError(f"source.encoding: '{cfg.encoding}' is not a known text encoding (e.g. utf-8, latin-1)") from None


def csv_dialect(cfg: SourceConfig) -> dict:
    """pyarrow's ParseOptions of CSV and TSV (parity_applies reads them to know whether quote
    parity finds the records). TSV has no quoting (IANA text/tab-separated-values): a lone '"' in a
    tweet must not swallow lines."""
    return {"delimiter": "\t", "quote_char": False} if cfg.format == "tsv" else {"newlines_in_values": True}


# ---------------------------------------------------------------- CSV: record starts from quote parity


def parity_applies(cfg: SourceConfig) -> bool:
    """Can quote parity find this CSV's record starts (module docstring)? The reader's dialect has the
    RFC 4180 quoting the count models, and the encoding writes quote, delimiter and line breaks as
    their ASCII bytes, no other byte being one of them (UTF-8, latin-1, cp1252: yes)."""
    from pyarrow import csv

    opts = csv.ParseOptions(**csv_dialect(cfg))
    if cfg.format != "csv" or opts.quote_char != '"' or not opts.double_quote or opts.escape_char is not False:
        return False
    encoding = codec_of(cfg)
    if not cuttable(encoding):
        return False
    table = bytes(range(128)).decode() if encoding == "utf-8" else bytes(range(256)).decode(encoding, errors="replace")
    return all(ch.encode(encoding) == ch.encode("ascii") and table.count(ch) == 1
               for ch in ('"', opts.delimiter, "\r", "\n"))


def quote_facts(path: Path, span: tuple) -> tuple[int, int | None, int | None]:
    """Round 1a of a CSV's bytes `span`: (quote bytes in it, the first line start after a b"\\n" at an
    even and at an odd count of quotes since span[0], or None); in SCAN_BYTES blocks."""
    import numpy as np

    quotes, first, offset = 0, [None, None], span[0]
    with open(path, "rb") as f:
        f.seek(offset)
        while offset < span[1] and (data := f.read(min(SCAN_BYTES, span[1] - offset))):
            arr = np.frombuffer(data, dtype=np.uint8)
            at = np.flatnonzero(arr == QUOTE)
            if None in first:
                breaks = np.flatnonzero(arr == LF)
                parity = (np.searchsorted(at, breaks) + quotes) % 2  # quotes before each line break
                for p in (0, 1):
                    if first[p] is None and (hits := breaks[parity == p]).size:
                        first[p] = offset + int(hits[0]) + 1
            quotes, offset = quotes + int(at.size), offset + len(data)
    return quotes, first[0], first[1]


def record_parts(pieces: list[Part], counted: list[tuple], size: int) -> list[Part]:
    """The line-start ranges `pieces` moved to record starts, from their quote_facts (O(parts)): a range
    whose start has an even count of quotes before it starts a record; else its first line start at an
    even count in the file (an odd one since the range's start), else the next range's record start."""
    parity, total = [], 0
    for quotes, _, _ in counted:
        parity.append(total)
        total = (total + quotes) % 2
    record, after = [0] * len(pieces), size
    for k in reversed(range(len(pieces))):
        found = pieces[k].span[0] if parity[k] == 0 else counted[k][2]
        record[k] = after = found if found is not None else after
    header = counted[0][1] if counted[0][1] is not None else (record[1] if len(pieces) > 1 else size)
    bounds = sorted({0, *record[1:], size})
    if len(bounds) <= 2:
        return [WHOLE]
    return [Part(span=(a, b), header=(0, header)) for a, b in zip(bounds[:-1], bounds[1:])]


def parity_holds(data: bytes | memoryview, delimiter: str) -> bool:
    """Does quote parity give pyarrow's parse of these bytes, which start at a record start? Yes when
    each quote at an even count (opening) follows a delimiter, a line break, a quote or the start, and
    each at an odd count (closing, or the first of a doubled pair) is followed by a quote, a delimiter,
    a line break or the end: then pyarrow's parser toggles at exactly those quotes."""
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    at = np.flatnonzero(arr == QUOTE)
    if not at.size:
        return True
    fences = np.array([ord(delimiter), LF, CR, QUOTE], dtype=np.uint8)
    opening, closing = at[0::2], at[1::2] + 1
    before_ok = (opening == 0) | np.isin(arr[np.maximum(opening - 1, 0)], fences)
    after_ok = (closing == arr.size) | np.isin(arr[np.minimum(closing, arr.size - 1)], fences)
    return bool(before_ok.all() and after_ok.all())


def whole_records(data: bytes, cfg: SourceConfig, part: Part) -> bool:
    """Do a quoted CSV part's bytes (the header put before them) hold whole records? Only when the part
    was cut at record starts by quote parity (parts.record_parts) and its own quotes sit where that
    rule is pyarrow's parse (parts.parity_holds; part 0 holds the header and checks it)."""
    import codecs

    from pyarrow import csv

    if part.header is None:  # cut at line starts: a quoted line break may straddle the cut
        return False
    skip = part.header[1] - part.header[0] if part.span[0] > 0 else 0
    if not skip and codec_of(cfg) == "utf-8" and data.startswith(codecs.BOM_UTF8):
        skip = len(codecs.BOM_UTF8)  # pyarrow skips a UTF-8 byte-order mark before the header
    return parity_holds(memoryview(data)[skip:], csv.ParseOptions(**csv_dialect(cfg)).delimiter)


def agree(facts: list[Facts]) -> bool:
    """Did the JSONL parts take the path one read of the whole file takes? Its pyarrow parse fails
    where a part's does, or where parts infer different kinds for a column; then it, and so every
    part, uses the line reader (whose strings differ: 1.0 is "1.0" there, "1" from pyarrow)."""
    read = [f for f in facts if f.rows or f.error]
    return not any(f.lines for f in read) and consistent_kinds(read)


def consistent_kinds(facts: list[Facts]) -> bool:
    kinds: dict[str, str] = {}
    for f in facts:
        for column, kind in f.kinds.items():
            if kind and kinds.setdefault(column, kind) != kind:
                return False
    return True
