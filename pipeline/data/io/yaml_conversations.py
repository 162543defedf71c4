"""source.format=conversations: YAML files of question/answer conversations, the chatterbot-corpus layout

    categories: [AI, artificial intelligence]
    conversations:
    - - What is AI?                     # user
      - AI is the field of science ...  # assistant
      - ...                             # user, assistant, ... in turn

`source.path` is one such file or a folder of them (`source.glob`, searched recursively: *.yml). Each
conversation is one row, its text encoded by pipeline/data/io/conversation.py; `source.label_field` names a
top-level key whose value (the first, if a list) is every row's label (categories: stratify by topic).
Rows have content ids (load.py); the files are read in sorted order. A conversation that is not a list of two
or more text turns (chatterbot's trivia.yml has one, a string) fails naming its file and index, or with
source.bad_lines=skip is skipped and counted.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pipeline.data.engines.ops import TEXT
from pipeline.data.io import conversation, readers
from pipeline.data.io.parts import WHOLE, Facts, Part, codec_of
from pipeline.schema import SourceConfig


def conversation_files(path: Path, cfg: SourceConfig) -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted(f for f in path.rglob(cfg.glob) if f.is_file())
    if not found:
        raise ValueError(f"source.path: {path} has no {cfg.glob} files (source.glob); format=conversations reads "
                         f"YAML files with a `conversations:` list")
    return found


def _loader():
    """yaml's SafeLoader without aliases: `*name` repeats a node by reference, and a few nested aliases make
    billions of conversations from a small file (the "billion laughs"); a conversation file has no use for one."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, "an alias (*name): conversation files may not repeat "
                                                  "nodes by reference", self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return NoAliases


def _load_yaml(path: Path, encoding: str) -> dict:
    import yaml

    raw = path.read_bytes()
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: bytes {raw[e.start:e.end]!r} are not valid {encoding}; set "
                         f"source.encoding to the file's encoding") from None
    try:
        doc = yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader, aliases refused
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid YAML (nested too deeply to read: past Python's recursion limit)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("conversations"), list):
        raise ValueError(f"{path}: expected a mapping with a `conversations:` list (format=conversations)")
    return doc


def _label(doc: dict, path: Path, key: str) -> str:
    if not key:
        return ""
    if key not in doc:
        raise ValueError(f"{path}: no top-level key '{key}' (source.label_field); keys: {', '.join(map(str, doc))}")
    value = doc[key]
    value = value[0] if isinstance(value, list) and value else value
    if not isinstance(value, (str, int, float)):
        raise ValueError(f"{path}: '{key}' (source.label_field) holds {type(value).__name__}, expected text")
    return readers.storable(str(value))


def read_conversations(path: Path, cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table, Facts]:
    """Every conversation of every file as a row: text (encoded), label, and no id or split of its own."""
    texts, labels, bad = [], [], 0
    for f in conversation_files(path, cfg):
        doc = _load_yaml(f, codec_of(cfg))
        label = _label(doc, f, cfg.label_field)
        for k, turns in enumerate(doc["conversations"]):
            where = f"{f}: conversations[{k}]"
            try:
                texts.append(readers.storable(conversation.encode(conversation.from_turns(turns, where))))
            except ValueError as e:
                if cfg.bad_lines == "skip":
                    bad += 1
                    continue
                message = str(e) if str(e).startswith(where) else f"{where}: {e}"
                raise ValueError(f"{message}; fix it or set source.bad_lines=skip") from None
            labels.append(label)
    return pa.table({TEXT: pa.array(texts, pa.string()), "label": pa.array(labels, pa.string()),
                     "source_split": pa.array([""] * len(texts), pa.string())}), Facts(rows=len(texts), bad=bad)
