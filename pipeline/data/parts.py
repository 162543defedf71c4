"""The pieces a source is read in: the local engine reads one (the whole source), the Ray engine
one per task (engine_ray.RayEngine.load_source), with the same readers (readers.py) and the same
rules for what the pieces add up to (sources.settle).

How each format is cut (`plan_parts`), always into contiguous pieces in file order:
- JSONL and TSV: byte ranges cut at line starts (a line is a record: TSV has no quoting), when the
  encoding is UTF-8 or one byte per character (elsewhere a b"\\n" byte may sit inside a character:
  one part); a bad line keeps its real line number (the part counts the lines before it, on error).
- CSV: byte ranges only when the file holds no quote character: a quoted value may hold a line
  break (`newlines_in_values`), so a line start need not be a record start, and finding the record
  starts is the sequential parse a part cannot do. A part that finds a `"` says so (Facts.quoted)
  and the whole file is then read again as one part (one task per file: the honest fallback).
- Parquet: row groups, in the dataset's fragment order. Label folders: the files, listed here (on
  the driver), in their sorted order.
- The Hub is read whole, on the driver (sources._read_hub).
readers.py imports Part and Facts from here; this module imports readers only inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import SourceConfig

MAX_PART_BYTES = 256 * 2**20  # a part is held by its task whole (pyarrow's parsers read it in one piece)


@dataclass(frozen=True)
class Part:
    """What one reader call reads (plan_parts plans them): bytes [start, end) of a text file
    cut at line starts, row groups (file, id) of Parquet, files (split, label, path) of a label
    folder; None: all of it (the local engine reads the whole source as one part)."""

    span: tuple | None = None
    groups: tuple | None = None
    files: tuple | None = None


WHOLE = Part()


@dataclass
class Facts:
    """What a reader says about its part besides the rows, so that parts add up to one read of the
    whole source (sources.settle): errors are returned, not raised, and applied in file order."""

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


def plan_parts(path: Path, cfg: SourceConfig, n: int) -> list[Part]:
    """`path` cut into at most `n` parts (fewer where there are fewer lines, row groups or files),
    at least one per MAX_PART_BYTES of a text file; n <= 1: the whole source, untouched."""
    from pipeline.data import folders, readers

    if cfg.format == "folder":
        files = folders.folder_files(path, cfg) if n > 1 else None
        return [Part(files=tuple(c)) for c in _chunks(files, n)] if files else [WHOLE]
    if cfg.format == "parquet":
        groups = _row_groups(path) if n > 1 else []
        return [Part(groups=tuple(c)) for c in _chunks(groups, n)] if groups else [WHOLE]
    size = path.stat().st_size
    n = max(n, -(-size // MAX_PART_BYTES))
    if n <= 1 or not _cuttable(readers._codec(cfg)):
        return [WHOLE]
    cuts = _line_starts(path, [size * k // n for k in range(1, n)])
    bounds = sorted({0, *cuts, size})
    return [Part(span=(a, b)) for a, b in zip(bounds[:-1], bounds[1:])] if len(bounds) > 2 else [WHOLE]


def _chunks(items: list, n: int) -> list[list]:
    """`items` in at most `n` contiguous, near-equal, non-empty runs."""
    n = max(1, min(n, len(items)))
    return [items[len(items) * k // n: len(items) * (k + 1) // n] for k in range(n)]


def _cuttable(encoding: str) -> bool:
    """Is every b"\\n" byte a line break, and the byte after it a character's start? UTF-8, and the
    codecs of one byte per character (latin-1, cp1252, ...), yes; UTF-16/32 or stateful ones, no."""
    if encoding == "utf-8":
        return True
    try:
        return len(bytes(range(256)).decode(encoding, errors="replace")) == 256 and "\n".encode(encoding) == b"\n"
    except (LookupError, UnicodeError):
        return False


def _line_starts(path: Path, offsets: list[int]) -> list[int]:
    """For each byte offset, the start of the first line that begins after it (reads one partial line)."""
    starts = []
    with open(path, "rb") as f:
        for offset in offsets:
            f.seek(max(0, offset - 1))
            f.readline()  # the rest of the line holding byte offset-1: the next line starts at a record
            starts.append(f.tell())
    return starts


def _row_groups(path: Path) -> list[tuple[str, int]]:
    """(file, row group id) of a Parquet dataset, in the order it reads them; metadata only."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from pipeline.data.readers import _pyarrow_message

    try:
        groups = []
        for fragment in pads.dataset(path, format="parquet").get_fragments():
            groups += [(fragment.path, k) for k in range(fragment.metadata.num_row_groups)]
        return groups
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot read as Parquet: {_pyarrow_message(e)}") from None


def read_part(path: Path, cfg: SourceConfig, part: Part = None, lines: bool = False) -> tuple:
    """(the part's rows as a pyarrow table, or None, and its Facts): the format's reader, with every
    error in the Facts (applied in file order by sources.settle), not raised."""
    from pipeline.data import readers

    part = part or WHOLE
    try:
        if cfg.format == "jsonl":
            return readers.read_jsonl(path, cfg, part, lines)
        return readers.READERS[cfg.format](path, cfg, part)
    except ValueError as e:
        return None, Facts(error=(1, None, str(e)))
    except OSError as e:  # permission denied, a FIFO, an I/O error: not a traceback
        return None, Facts(error=(0, None, f"{e.filename or path}: cannot read: {e.strerror or e}"))


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
