"""The label-folder reader of the load stage: root/<label>/*.txt or root/<split>/<label>/*.txt (the
IMDB release), one document per file, id = its path relative to root (readers.py has the others)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

from pipeline import artifacts
from pipeline.data.engines.ops import TEXT
from pipeline.data.io.parts import WHOLE, Facts, Part, codec_of
from pipeline.schema import SourceConfig

FOLDER_SPLITS = ("train", "validation", "valid", "val", "dev", "test")


def folder_files(path: Path, cfg: SourceConfig) -> list[tuple[str, str, Path]]:
    """root/<label>/*.txt, or root/<split>/<label>/*.txt (the IMDB release): (split, label, file), the
    first max_rows of them; an empty class folder is warned about."""
    if not path.is_dir():
        raise ValueError(f"source.path: {path} is a file; format=folder expects a folder of <label>/*.txt")
    split_dirs = [d for d in _subfolders(path) if d.name.lower() in FOLDER_SPLITS]
    files = []  # (split, label, file)
    for split_dir in split_dirs or [path]:
        for label_dir in _subfolders(split_dir):
            found = sorted(label_dir.glob(cfg.glob))
            odd = next(((f, kind) for f in found if (kind := artifacts.special_kind(f))), None)  # links followed
            if odd is not None:  # a FIFO blocks its reader forever, a device never ends
                raise ValueError(f"source.path: {odd[0]} is {odd[1]}, not a regular file; move it out of the folder")
            if not found:  # a class that silently vanished would only show up as a worse model
                print(f"warning: {label_dir} has no {cfg.glob} files (source.glob): class '{_name(label_dir.name)}' gets no documents "
                      f"from it", file=sys.stderr)
            files += [(split_dir.name if split_dirs else "", label_dir.name, f) for f in found]
    if not files:
        raise ValueError(f"source.path: {path} has no <label>/{cfg.glob} files (source.glob); expected root/<label>/{cfg.glob} "
                         f"or root/{{train,test}}/<label>/{cfg.glob}")
    return files[: cfg.max_rows] if cfg.max_rows > 0 else files


def read_folder(path: Path, cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table, Facts]:
    """The label folder's files (or those of `part`) as rows; id = the file's path relative to `path`."""
    files = folder_files(path, cfg) if part.files is None else part.files

    encoding = codec_of(cfg)
    texts = [_read_text(f, encoding) for _, _, f in files]
    return pa.table({
        "id": pa.array([_name(f.relative_to(path).as_posix()) for _, _, f in files], pa.string()),
        TEXT: pa.array(texts, pa.string()),
        "label": pa.array([_name(label) for _, label, _ in files], pa.string()),
        "source_split": pa.array([split for split, _, _ in files], pa.string()),
    }), Facts(rows=len(files))


def _subfolders(path: Path) -> list[Path]:
    """Visible subfolders: `.ipynb_checkpoints`, `.git` or a package's `__pycache__` is no class."""
    return [d for d in sorted(path.iterdir()) if d.is_dir() and not d.name.startswith(".") and d.name != "__pycache__"]


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
