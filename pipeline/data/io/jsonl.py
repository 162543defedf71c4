"""One line of JSONL as an object: the parse and its one-line errors, shared by the source reader (readers.py)
and the contamination check's evaluation files (references.py), which no reader's edit should rerun."""

from __future__ import annotations

import json


def json_object(line: str) -> dict:
    """One line of JSONL as a dict, or a ValueError saying what it is instead (the caller adds file:line)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:  # [[[[...]]]] thousands deep: past Python's recursion limit, not a record
        raise ValueError("JSON nested too deeply to read (past Python's recursion limit)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj
