"""Instruction data: a conversation (prompt/completion pairs are one user and one assistant message) as the
text of one row, so that every stage that moves, dedups, splits or checks text handles it unchanged.

A conversation's text is each message's content after a one-character mark of its role (ROLE_MARKS: ASCII
separator controls). The marks never occur in a content: `encode` removes them from a content, as clean
removes every C0 control from text. They are not word characters, so dedup's shingles, the leakage
check and the n-gram contamination check see the contents' words only, and two examples are duplicates
by the whole example (every message, roles in place), never by one turn.

`source.format=conversations` (YAML files, the chatterbot-corpus layout), `source.messages_field` (a list
of {role, content} objects) and `source.prompt_field` (prompt and completion columns) make such rows;
task=instruct (pipeline/tasks/instruct/) renders them with a chat template and trains on the assistant's
tokens only.
"""

from __future__ import annotations

import re
from typing import Any

ROLE_MARKS = {"system": "\x1c", "user": "\x1d", "assistant": "\x1e"}
ROLE_OF = {mark: role for role, mark in ROLE_MARKS.items()}
_SPLIT = re.compile("([\x1c\x1d\x1e])")


def conversational(source: Any) -> bool:
    """Whether the source config makes conversation rows (and clean cleans each message)."""
    return source.format == "conversations" or bool(source.messages_field or source.prompt_field)


def encode(messages: list[dict]) -> str:
    """[{role, content}] -> the row's text. A role outside ROLE_MARKS, a content that is not text and a
    conversation without an assistant message are one-line errors (the caller adds where)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("a conversation is a non-empty list of {role, content} messages")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {k} is not an object with 'role' and 'content'")
        role, content = m["role"], m["content"]
        if role not in ROLE_MARKS:
            raise ValueError(f"message {k} has role {role!r}; roles are {', '.join(ROLE_MARKS)}")
        if not isinstance(content, str):
            raise ValueError(f"message {k}'s content is {type(content).__name__}, expected text")
        if _SPLIT.search(content):
            content = _SPLIT.sub("", content)  # what clean does to any control character
        out.append(ROLE_MARKS[role] + content)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant message to learn from")
    if messages[0]["role"] == "assistant":  # tokenize renders the prompt before each answer: here there is none
        raise ValueError("message 0 is the assistant's: a conversation opens with a system or user message, the "
                         "prompt its first answer follows")
    return "".join(out)


def is_encoded(text: str) -> bool:
    """Whether `text` is a conversation row's text (it starts with a role mark)."""
    return bool(text) and text[0] in ROLE_OF


def decode(text: str) -> list[dict]:
    """The row's text -> [{role, content}]; a text without marks is one user message (never made by load)."""
    pieces = _SPLIT.split(text)
    if len(pieces) == 1:
        return [{"role": "user", "content": text}]
    return [{"role": ROLE_OF[mark], "content": content} for mark, content in zip(pieces[1::2], pieces[2::2])]


def from_turns(turns: list, where: str) -> list[dict]:
    """A chatterbot-style conversation, [user, assistant, user, ...] strings, as messages."""
    if not isinstance(turns, list) or len(turns) < 2:
        raise ValueError(f"{where}: a conversation is a list of at least two turns (a question and its answer)")
    for k, t in enumerate(turns):
        if not isinstance(t, str):
            raise ValueError(f"{where}[{k}]: a turn is {type(t).__name__}, expected text")
    return [{"role": "user" if k % 2 == 0 else "assistant", "content": t} for k, t in enumerate(turns)]


def plain(text: str) -> str:
    """The contents one per line, roles left out: what a person reads (reports, samples)."""
    return "\n".join(m["content"] for m in decode(text))
