"""User text in a rendered file is shown as written (pipeline/escape.py); the whole card: tests/training/test_card.py
(test_label_names_and_paths_reach_the_card_and_the_plots_as_text)."""

from __future__ import annotations

import markdown_it
import pytest

from pipeline.escape import markdown, markdown_code, plot_label

CASES = ["<script>alert(1)</script>", "pos\n## Injected", "a|b", "x_y*z*", "$5", "back\\slash", "C++ [x](y)", "a&b",
         "- item", "`tick`", "tab\there", "line\u2028sep", "esc\x1b[31m"]


def _rendered_text(md: str) -> str:
    """What a CommonMark renderer shows for one paragraph: its HTML with the <p> wrapper off and entities back."""
    import html

    out = markdown_it.MarkdownIt("commonmark").render(md).strip()
    assert out.startswith("<p>") and out.endswith("</p>") and out.count("<p>") == 1, out  # one paragraph, no block
    return html.unescape(out[3:-4])


@pytest.mark.parametrize("text", CASES)
def test_markdown_renders_as_the_text_reads_on_one_line(text):
    shown = _rendered_text("before " + markdown(text) + " after")
    visible = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    assert shown == f"before {visible} after"


@pytest.mark.parametrize("text", CASES)
def test_a_code_span_holds_the_text_verbatim(text):
    rendered = markdown_it.MarkdownIt("commonmark").render(markdown_code(text)).strip()
    import html

    visible = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    assert rendered.startswith("<p><code>") and html.unescape(rendered[9:-11]) == visible, rendered


def test_a_plot_label_is_not_math():
    assert plot_label("$5 and $10") == r"\$5 and \$10" and plot_label("a\nb") == r"a\nb"
