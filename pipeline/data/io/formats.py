"""A source by format: how it is cut into parts (`plan_parts`) and which reader reads a part (`read_part`).
What a part is, and the byte-level rules of cutting text files, are parts.py's."""

from __future__ import annotations

from pathlib import Path

from pipeline.data.io import folders, hub, parts, readers, yaml_conversations
from pipeline.schema import SourceConfig


def plan_parts(path: Path, cfg: SourceConfig, n: int) -> list[parts.Part]:
    """`path` cut into at most `n` parts (fewer where there are fewer lines, row groups or files),
    at least one per MAX_PART_BYTES of a text file; n <= 1: the whole source, untouched."""
    if cfg.format == "hub":
        return hub.hub_parts(cfg, n)
    if cfg.format == "conversations":  # a few small YAML files: one part
        return [parts.WHOLE]
    if cfg.format == "folder":
        files = folders.folder_files(path, cfg) if n > 1 else None
        return [parts.Part(files=tuple(c)) for c in parts.runs(files, n)] if files else [parts.WHOLE]
    if cfg.format == "parquet":
        groups = _row_groups(path) if n > 1 else []
        return [parts.Part(groups=tuple(c)) for c in parts.runs(groups, n)] if groups else [parts.WHOLE]
    size = path.stat().st_size
    n = max(n, -(-size // parts.MAX_PART_BYTES))
    if n <= 1 or not parts.cuttable(parts.codec_of(cfg)):
        return [parts.WHOLE]
    cuts = parts.line_starts(path, [size * k // n for k in range(1, n)])
    bounds = sorted({0, *cuts, size})
    return [parts.Part(span=(a, b)) for a, b in zip(bounds[:-1], bounds[1:])] if len(bounds) > 2 else [parts.WHOLE]


def _row_groups(path: Path) -> list[tuple[str, int]]:
    """(file, row group id) of a Parquet dataset, in the order it reads them; metadata only."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    try:
        groups = []
        for fragment in pads.dataset(path, format="parquet").get_fragments():
            groups += [(fragment.path, k) for k in range(fragment.metadata.num_row_groups)]
        return groups
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot read as Parquet: {readers._pyarrow_message(e)}") from None


def read_part(path: Path, cfg: SourceConfig, part: parts.Part = None, lines: bool = False) -> tuple:
    """(the part's rows as a pyarrow table, or None, and its Facts): the format's reader, with every
    error in the Facts (applied in file order by load.settle), not raised."""
    part = part or parts.WHOLE
    try:
        if cfg.format == "hub":
            return hub.read_hub(cfg, part)
        if cfg.format == "jsonl":
            return readers.read_jsonl(path, cfg, part, lines)
        if cfg.format == "conversations":
            return yaml_conversations.read_conversations(path, cfg, part)
        return readers.READERS[cfg.format](path, cfg, part)
    except ValueError as e:
        return None, parts.Facts(error=(1, None, str(e)))
    except OSError as e:  # permission denied, a FIFO, an I/O error: not a traceback
        return None, parts.Facts(error=(0, None, f"{e.filename or path}: cannot read: {e.strerror or e}"))
