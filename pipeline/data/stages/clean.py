"""Stage 1, clean: repair and normalise text, then drop rows that are too short, too long or empty.

Per text, in this order (each step is why the next one can be simple):
  1. mojibake repair with ftfy (before anything that would destroy the byte patterns it reads;
     ftfy's own HTML unescaping, quote uncurling and width folding are off: steps 2-3 own those)
  2. HTML: tags removed (block tags such as <br /> become a space), then entities unescaped,
     so an escaped "&lt;b&gt;" survives as the literal text "<b>"
  3. Unicode normalisation (NFC or NFKC)
  4. control characters, zero-width and bidi-control characters removed; ZWJ/ZWNJ only where they
     touch ASCII (inside emoji sequences and Indic/Persian words they carry meaning)
  5. a leading "RT @user:" retweet marker removed (before mentions are replaced)
  6. lowercase (before URL/mention tokens go in, so the tokens keep their case)
  7. URLs and @mentions kept, removed or replaced by a token
  8. whitespace runs collapsed to one space, ends stripped (keep_lines: within each line; line breaks kept)
Rows are then dropped with a counted reason: empty_after_clean, too_short, too_long, too_few_words.
A conversation (instruction data) is cleaned message by message, and dropped as empty_message when one
is left empty; a sentence pair side by side, dropped as empty_side when a side is left empty.
Words counted for min_words exclude the URL/mention replacement tokens ("[url]" is not content).
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from collections import Counter

import ftfy
from ftfy import badness

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import TEXT, add_up
from pipeline.data.io import conversation, pair
from pipeline.schema import CleanConfig

# ftfy for encoding repair only; the later steps of this module own the rest
_FTFY = ftfy.TextFixerConfig(
    unescape_html=False, uncurl_quotes=False, fix_latin_ligatures=False, fix_character_width=False,
    normalization=None, explain=False,
)
_BLOCK_TAG = re.compile(r"</?(?:br|p|div|li|ul|ol|tr|td|th|h[1-6]|blockquote|hr|table)\b[^<>]*>", re.I)
# a tag starts with a letter right after "<": "<3" and "a < b > c" are text, not tags
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>")
_TAG_OR_COMMENT = re.compile(r"<!--|" + _TAG.pattern)
_JOINER_AT_ASCII = re.compile(r"(?<=[\x00-\x7f])[\u200c\u200d]+|[\u200c\u200d]+(?=[\x00-\x7f])|^[\u200c\u200d]+|[\u200c\u200d]+$")
_RETWEET = re.compile(r"^\s*(?:RT\s*@[A-Za-z0-9_]+\s*:?\s*)+")
# a URL ends on a character that is not sentence punctuation: "see http://x.co/a." keeps the "."
_URL = re.compile(r"(?:\bhttps?://|\bwww\.)[!-~]*[A-Za-z0-9/#=~+&%_-]", re.I)
_MENTION = re.compile(r"(?<![A-Za-z0-9_@.])@[A-Za-z0-9_]+")
_SPACE = re.compile(r"\s+")


def _invisible_table() -> dict[int, str | None]:
    """str.translate table: line-like controls become spaces; other controls and invisibles go."""
    table: dict[int, str | None] = {c: None for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]}
    for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85, 0x2028, 0x2029):  # tab, line breaks, NEL, separators
        table[c] = " "
    zero_width = [0x00AD, 0x061C, 0x180E, 0x200B, 0x200E, 0x200F, *range(0x202A, 0x202F),
                  *range(0x2060, 0x2065), *range(0x2066, 0x206A), 0xFEFF, 0xFFF9, 0xFFFA, 0xFFFB]
    table.update({c: None for c in zero_width})
    return table


_INVISIBLE = _invisible_table()
_INVISIBLE_KEEP_LINES = {**_INVISIBLE, 0x0A: "\n", 0x0B: "\n", 0x0C: "\n", 0x0D: "\n", 0x85: "\n", 0x2028: "\n",
                         0x2029: "\n\n"}
_BLANK_LINES = re.compile(r"\n{3,}")


def _lines(text: str) -> str:
    """clean.keep_lines: spaces collapsed and stripped within each line, at most one blank line in a row."""
    return _BLANK_LINES.sub("\n\n", "\n".join(_SPACE.sub(" ", line).strip() for line in text.split("\n"))).strip()


def repair(text: str) -> str:
    """ftfy's encoding repair; ASCII text has nothing for it to repair except terminal escapes."""
    if text.isascii() and "\x1b" not in text:
        return text
    return ftfy.fix_text(text, _FTFY)


def strip_tags(text: str) -> str:
    """`<!--.*?-->|<tag>` removed, left to right, without that regex's quadratic case: it rescans
    to the end of the text for every "<!--" that is never closed (14 s for an 80 KB row of them,
    75 s for 160 KB). Here one unclosed "<!--" ends the search for comments, since no later one
    can be closed either; the result is the same string the regex gives."""
    if "<!--" not in text:
        return _TAG.sub("", text)
    out, pos = [], 0
    while found := _TAG_OR_COMMENT.search(text, pos):
        out.append(text[pos : found.start()])
        pos = found.end()
        if found.group() == "<!--":
            close = text.find("-->", pos)
            if close < 0:  # the regex keeps this "<" as text and finds only tags after it
                out.append("<" + _TAG.sub("", text[found.start() + 1 :]))
                return "".join(out)
            pos = close + 3
    out.append(text[pos:])
    return "".join(out)


def normalise(text: str, cfg: CleanConfig) -> str:
    """Steps 2-8 of the module docstring (everything after mojibake repair)."""
    if cfg.strip_html and "<" in text:
        text = strip_tags(_BLOCK_TAG.sub(" ", text))
    if cfg.strip_html and "&" in text:
        text = html.unescape(text)
    if cfg.normalize != "none":
        text = unicodedata.normalize(cfg.normalize, text)
    text = text.replace("\r\n", "\n").translate(_INVISIBLE_KEEP_LINES) if cfg.keep_lines else text.translate(_INVISIBLE)
    if "\u200c" in text or "\u200d" in text:
        text = _JOINER_AT_ASCII.sub("", text)
    if cfg.strip_retweet:
        text = _RETWEET.sub("", text)
    if cfg.lowercase:
        text = text.lower()
    if cfg.urls != "keep":
        text = _URL.sub(cfg.url_token if cfg.urls == "replace" else " ", text)
    if cfg.mentions != "keep":
        text = _MENTION.sub(cfg.mention_token if cfg.mentions == "replace" else " ", text)
    return _lines(text) if cfg.keep_lines else _SPACE.sub(" ", text).strip()


def clean_text(text: str, cfg: CleanConfig) -> str:
    """The cleaned text (pure: the same input and config always give the same output)."""
    return normalise(repair(text) if cfg.fix_mojibake else text, cfg)


def drop_reason(text: str, cfg: CleanConfig) -> str:
    """Why a cleaned text is dropped, or "" to keep it."""
    if not text:
        return "empty_after_clean"
    if len(text) < cfg.min_chars:
        return "too_short"
    if cfg.max_chars and len(text) > cfg.max_chars:
        return "too_long"
    if cfg.min_words > 1:
        tokens = {cfg.url_token if cfg.urls == "replace" else None, cfg.mention_token if cfg.mentions == "replace" else None}
        if sum(w not in tokens for w in text.split()) < cfg.min_words:
            return "too_few_words"
    return ""


def _clean_one(raw: str, cfg: CleanConfig) -> tuple[str, str, bool, bool]:
    """(cleaned text, drop reason, repaired, still suspect) of one text."""
    fixed = repair(raw) if cfg.fix_mojibake else raw
    text = normalise(fixed, cfg)
    return text, drop_reason(text, cfg), fixed != raw, not text.isascii() and badness.is_bad(text)


def _clean_conversation(raw: str, cfg: CleanConfig) -> tuple[str, str, bool, bool]:
    """A conversation cleaned message by message (the role marks kept); dropped when a message is left empty,
    and by the other filters on its contents one per line (too short, too long, too few words)."""
    messages = conversation.decode(raw)
    results = [_clean_one(m["content"], cfg) for m in messages]
    cleaned = [{"role": m["role"], "content": text} for m, (text, *_) in zip(messages, results)]
    reason = "empty_message" if any(not text for text, *_ in results) else \
        drop_reason("\n".join(text for text, *_ in results), cfg)
    text = conversation.encode(cleaned) if reason != "empty_message" else ""
    return text, reason, any(r[2] for r in results), any(r[3] for r in results)


def _clean_pair(raw: str, cfg: CleanConfig, symmetric: bool = False) -> tuple[str, str, bool, bool]:
    """A sentence pair cleaned side by side; dropped as empty_side when a side is left empty, and by the other
    filters on the two sides together. A symmetric pair is stored in its one order (pair.canonical)."""
    results = [_clean_one(side, cfg) for side in pair.decode(raw)]
    (first, *_), (second, *_) = results
    reason = "empty_side" if not first or not second else drop_reason(f"{first}\n{second}", cfg)
    if symmetric:
        first, second = pair.canonical(first, second)
    text = pair.encode(first, second) if reason != "empty_side" else ""
    return text, reason, any(r[2] for r in results), any(r[3] for r in results)


def _clean_batch(batch: dict, cfg: CleanConfig, conversations: bool = False, pairs: str = "") -> dict:
    """Batched map: new text, the drop reason, and two counters' worth of flags for the report."""
    one = _clean_conversation if conversations else _clean_one
    if pairs:
        one = functools.partial(_clean_pair, symmetric=pairs == "symmetric")
    texts, reasons, repaired, suspect = [], [], [], []
    for raw in batch[TEXT]:
        text, reason, fixed, bad = one(raw, cfg)
        texts.append(text)
        reasons.append(reason)
        repaired.append(fixed)
        suspect.append(bad)  # mojibake ftfy could not repair
    return {TEXT: texts, "_drop": reasons, "_repaired": repaired, "_suspect": suspect}


def clean_texts(texts: list[str], cfg: CleanConfig, conversations: bool = False, pairs: str = "") -> tuple[list, list]:
    """(cleaned texts, drop reasons: "" = kept) of `texts`, as the stage cleans a batch: predict.py cleans new rows
    with a run's recorded settings through it."""
    out = _clean_batch({TEXT: texts}, cfg, conversations, pairs)
    return out[TEXT], out["_drop"]


def _kept(table):
    """The rows a batch keeps (pyarrow mask): those without a drop reason."""
    import pyarrow.compute as pc

    return pc.equal(table.column("_drop"), "")


def _tally(table) -> tuple[Counter, int, int]:
    """One batch's share of the report: rows by drop reason ("" = kept), repaired, still suspect."""
    import pyarrow.compute as pc

    return (Counter(table.column("_drop").to_pylist()), pc.sum(table.column("_repaired")).as_py() or 0,
            pc.sum(table.column("_suspect")).as_py() or 0)


def clean(ds, cfg: CleanConfig, ctx: StageContext) -> StageResult:
    """Clean every text; drop (and count by reason) the rows that fail the filters. The map, the
    counts and the filter are one pass (on Ray, in the tasks: the kept rows never reach the driver)."""
    import datasets

    added = {TEXT: datasets.Value("string"), "_drop": datasets.Value("string"),
             "_repaired": datasets.Value("bool"), "_suspect": datasets.Value("bool")}
    quiet = not ctx.progress and not datasets.are_progress_bars_disabled()  # restore what we found
    if quiet:
        datasets.disable_progress_bars()
    try:  # locally one process per ~5k rows at most: below that, starting processes costs more than it saves
        kept, (reasons, repaired, suspect) = ctx.engine.map_filter(
            ds, functools.partial(_clean_batch, cfg=cfg, conversations=ctx.conversations, pairs=ctx.pairs), added, _kept, drop=["_drop", "_repaired", "_suspect"],
            tally=_tally, combine=add_up, min_rows_per_proc=5000, batch_size=1000, desc="clean", keep_in_memory=True,
            load_from_cache_file=False)
    finally:
        if quiet:
            datasets.enable_progress_bars()
    stats = {"mojibake_repaired": repaired, "mojibake_suspect_after": suspect}
    dropped = {reason: n for reason, n in sorted(reasons.items()) if reason}
    return StageResult(kept, dropped, stats)
