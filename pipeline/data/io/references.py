"""Evaluation files the contamination check holds the train split against (split.contamination_files): a
benchmark's test set, read as documents. A .jsonl file is one document per line (its `text` field, or its
`messages` as a conversation; its `id`, else file:line); any other file (.txt, .md) is one document; a
folder is every such file under it, sorted. Their bytes are part of the split stage's fingerprint."""

from __future__ import annotations

from pathlib import Path

from pipeline import artifacts
from pipeline.data.io import conversation
from pipeline.data.io.jsonl import json_object

TEXT_SUFFIXES = (".jsonl", ".txt", ".md")


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if (kind := artifacts.special_kind(path)) is not None:
        raise ValueError(f"split.contamination_files: {path} is {kind}, not a file; name a .jsonl/.txt/.md file or a "
                         f"folder of them")
    if not path.is_dir():
        raise ValueError(f"split.contamination_files: {path} not found; name a .jsonl/.txt/.md file or a folder of them")
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not found:
        raise ValueError(f"split.contamination_files: {path} holds no {'/'.join(TEXT_SUFFIXES)} files")
    return found


def fingerprint(paths: list[str]) -> str:
    """The content of every evaluation file (a missing one is the one-line error `read` gives)."""
    return artifacts.fingerprint([artifacts.tree_fingerprint(p) for f in paths for p in _files(Path(f))])


def _jsonl(path: Path) -> tuple[list[str], list[str]]:
    ids, texts = [], []
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{k}"
            try:
                obj = json_object(line)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if isinstance(obj.get("text"), str):
                text = obj["text"]
            elif "messages" in obj:
                try:
                    text = conversation.encode(obj["messages"])
                except ValueError as e:
                    raise ValueError(f"{where}: field 'messages': {e}") from None
            else:
                raise ValueError(f"{where}: no 'text' (a string) or 'messages' field; keys: {', '.join(obj)}")
            ids.append(str(obj.get("id", f"{path.name}:{k}")))
            texts.append(text)
    return ids, texts


def read(paths: list[str]) -> tuple[list[str], list[str]]:
    """(ids, texts) of every document of the evaluation files, in order."""
    ids, texts = [], []
    for p in paths:
        for f in _files(Path(p)):
            try:
                if f.suffix == ".jsonl":
                    i, t = _jsonl(f)
                else:
                    i, t = [str(f)], [f.read_text(encoding="utf-8")]
            except UnicodeDecodeError as e:
                raise ValueError(f"{f}: bytes at offset {e.start} are not valid UTF-8") from None
            ids += i
            texts += t
    return ids, texts
