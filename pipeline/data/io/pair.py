"""Sentence pairs: the two texts of an example (MRPC's sentences, a question and a passage) as the text of one
row, so that every stage that moves, dedups, splits or checks text handles them unchanged.

A pair's text is its first text, MARK, its second. MARK (the ASCII unit separator) never occurs in a text:
`encode` removes it, as clean removes every C0 control. It is not a word character, so dedup's shingles and
the leakage checks compare whole pairs (both sides' words), never one side. With `source.symmetric_pairs`
(paraphrase, similarity: the order carries no meaning) clean stores the sides in one order, the smaller
first, so a pair and its swapped copy are exact copies to dedup and the leakage check.

`source.text_pair_field` makes such rows; clean cleans each side, and the tokenize stage encodes the two as a
pair (the tokenizer's pair template: [CLS] a [SEP] b [SEP], token_type_ids where the model has them).
"""

from __future__ import annotations

from typing import Any

MARK = "\x1f"


def paired(source: Any) -> str:
    """How the source config's rows are pairs: "" (not pairs), "ordered" or "symmetric"."""
    if not source.text_pair_field:
        return ""
    return "symmetric" if source.symmetric_pairs else "ordered"


def check_config(cfg: Any, pair_tasks: list[str]) -> None:
    """source.text_pair_field and the settings it cannot go with, before any work (one line each); `pair_tasks`:
    the tasks that read pairs (Task.pairs)."""
    src = cfg.source
    if not src.text_pair_field:
        if src.symmetric_pairs:
            raise ValueError("source.symmetric_pairs=true: set source.text_pair_field, the column of each pair's "
                             "second text")
        return
    if src.text_pair_field == src.text_field:
        raise ValueError(f"source.text_pair_field: '{src.text_pair_field}' is source.text_field too; a pair's two "
                         f"texts come from two columns")
    if cfg.task not in pair_tasks:
        raise ValueError(f"source.text_pair_field: task={cfg.task} does not take sentence pairs (tasks that do: "
                         f"{', '.join(pair_tasks)})")
    if src.format in ("folder", "conversations") or src.messages_field or src.prompt_field:
        what = f"source.format={src.format}" if src.format in ("folder", "conversations") else \
            ("source.messages_field" if src.messages_field else "source.prompt_field")
        raise ValueError(f"source.text_pair_field: {what} makes single texts or conversations, not pairs")
    if cfg.split.chunk != "none":
        raise ValueError(f"split.chunk={cfg.split.chunk}: a sentence pair is kept whole (each side is "
                         f"truncated by tokenize.pair_truncation); set split.chunk=none")
    if cfg.tokenize.truncation == "head_tail":
        raise ValueError("tokenize.truncation=head_tail keeps the two ends of one text; sentence pairs are cut by "
                         "tokenize.pair_truncation (longest_first, only_first, only_second)")


def encode(first: str, second: str) -> str:
    """Two texts -> the row's text; "" when either is empty (load drops the row as empty)."""
    first, second = first.replace(MARK, ""), second.replace(MARK, "")
    if not first.strip() or not second.strip():
        return ""
    return first + MARK + second


def decode(text: str) -> tuple[str, str]:
    """The row's text -> (first, second); a text without MARK is a first text alone (never made by load)."""
    first, _, second = text.partition(MARK)
    return first, second


def canonical(first: str, second: str) -> tuple[str, str]:
    """A symmetric pair's one order: the smaller text first (code points, so it never depends on a locale)."""
    return (first, second) if first <= second else (second, first)


def decode_all(texts: list[str]) -> tuple[list[str], list[str]]:
    """Many rows' texts -> (first texts, second texts): the tokenize stage's and the side check's input."""
    sides = [decode(t) for t in texts]
    return [a for a, _ in sides], [b for _, b in sides]

