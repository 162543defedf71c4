"""User text (label names, paths, experiment and split names) made safe for the format that renders it: a Markdown
file (the model card), a code span in one, a matplotlib label (the evaluation plots). What the user wrote is shown
as written, never read as markup: `<script>` stays text, a newline in a label cannot start a heading, `$5` is not
math."""

from __future__ import annotations

import re

# line breaks Markdown (and Python's str.splitlines) honours, and other control characters: shown escaped
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# what can start markup in the middle of a line (emphasis, code, links and images, tables, strikethrough, the hub's
# math, a heading's #): ( ) only follow a link's ], and - + . ! a list or image only where ] or a line start is
_MARKDOWN_PUNCTUATION = re.compile(r"[`*_\[\]#|~$]")


def _visible(text: str) -> str:
    """Control characters as their escapes (`\\n`, `\\x1b`): one line, and nothing a terminal or renderer acts on."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def markdown(text: str) -> str:
    """Inline Markdown text that renders as `text` reads: HTML's `& < >` as entities, Markdown's punctuation
    backslash-escaped where it could start markup (CommonMark lets any ASCII punctuation be; `$` too, which the
    hub reads as math), control characters and line breaks escaped."""
    out = _visible(text).replace("\\", "\\\\")
    out = out.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_PUNCTUATION.sub(lambda m: "\\" + m.group(), out)


def markdown_code(text: str) -> str:
    """An inline code span holding `text` verbatim (HTML inside a code span is shown, not run): fenced with one
    more backtick than the longest run in it, padded where it starts or ends with one; line breaks escaped."""
    body = _visible(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def plot_label(text: str) -> str:
    """A matplotlib tick label or title shown as written: `$` would start mathtext (and an unbalanced one fails
    the whole figure)."""
    return _visible(text).replace("$", r"\$")
