"""Known answers for pipeline/data/stages/clean.py: horrible strings in, exact strings out; drops counted."""

from __future__ import annotations

import dataclasses

import datasets
import pytest

from pipeline.checks import load_config
from pipeline.config import CleanConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.stages.clean import clean, clean_text

DEFAULT = CleanConfig()  # urls and mentions replaced, retweet markers stripped, NFC

HORRIBLE = [
    # mojibake ftfy can repair: UTF-8 read as latin-1 / cp1252
    ("cafÃ©", "café"),
    ("donâ€™t stop", "don’t stop"),
    # zero-width, BOM, soft hyphen, control characters, terminal escapes
    ("hel\u200blo wor\u200dld", "hello world"),
    ("\ufeffbom", "bom"),
    ("soft\u00adhyphen", "softhyphen"),
    ("a\x00b\x07c \x1b[31mred\x1b[0m", "abc red"),
    ("\u200b\u200b", ""),
    # RTL text kept; bidi overrides and marks removed
    ("שלום עולם", "שלום עולם"),
    ("\u202eevil\u202c text", "evil text"),
    ("مرحبا\u200f world", "مرحبا world"),
    # emoji: variation selector and ZWJ sequences kept; ZWJ touching ASCII removed; Persian ZWNJ kept
    ("I ❤️ NY 👨\u200d👩\u200d👧", "I ❤️ NY 👨\u200d👩\u200d👧"),
    ("ad\u200dmin", "admin"),
    ("می\u200cخواهم", "می\u200cخواهم"),
    # HTML: IMDB line breaks, tags, entities; "<3" and comparisons are text, escaped tags stay text
    ("Great movie.<br /><br />Loved it &amp; more &lt;3", "Great movie. Loved it & more <3"),
    ("<i>italic</i> and <a href='x'>link</a>", "italic and link"),
    ("x < y > z", "x < y > z"),
    ("&lt;b&gt;bold&lt;/b&gt;", "<b>bold</b>"),
    ("<p></p>", ""),
    # whitespace only (tab, newline, no-break space, ideographic space)
    ("  \t\n\u00a0\u3000 ", ""),
    # retweet markers, URLs (sentence punctuation stays outside), mentions (not e-mail addresses)
    ("RT @user_1: RT @b: hello world http://t.co/abc.", "hello world [url]."),
    ("(see https://example.com/a?b=1)", "(see [url])"),
    ("mail bob@example.com or @bob_2!", "mail bob@example.com or @user!"),
    # a very long token passes untouched (max_chars is the tool for it)
    ("😀" * 3 + "x" * 5000, "😀" * 3 + "x" * 5000),
    # NFC composes a combining accent
    ("e\u0301", "é"),
]


@pytest.mark.parametrize("raw, expected", HORRIBLE)
def test_horrible_strings(raw, expected):
    assert clean_text(raw, DEFAULT) == expected


def test_default_corpus_mojibake_is_beyond_ftfy():
    """The tweets corpus was mangled twice with bytes lost to '_': ftfy only maps C1 controls to cp1252."""
    assert clean_text("I look at GoogleÕ¢_\x8aÎ_\x86¢s cars", DEFAULT) == "I look at GoogleÕ¢_ŠÎ_†¢s cars"
    assert clean_text("http://t.co/AooIdjwtÕ¢_\x8aÎë\x9d scary!", DEFAULT) == "[url]Õ¢_ŠÎë scary!"


def test_options_change_the_output():
    cfg = dataclasses.replace(DEFAULT, lowercase=True, urls="remove", mentions="keep", strip_retweet=False)
    assert clean_text("RT @Bob: Hello http://X.co/A World", cfg) == "rt @bob: hello world"
    cfg = dataclasses.replace(DEFAULT, lowercase=True, url_token="[URL]", mention_token="@USER")
    assert clean_text("Hi @Bob http://x.co", cfg) == "hi @USER [URL]"
    assert clean_text("ﬁne ＡＢＣ", dataclasses.replace(DEFAULT, normalize="NFKC")) == "fine ABC"
    assert clean_text("ﬁne ＡＢＣ", DEFAULT) == "ﬁne ＡＢＣ"
    plain = dataclasses.replace(DEFAULT, fix_mojibake=False, strip_html=False)
    assert clean_text("cafÃ© <b>x</b>\x85y", plain) == "cafÃ© <b>x</b> y"  # NEL is a line break without ftfy
    assert clean_text("cafÃ©\x85y", DEFAULT) == "café…y"  # ftfy reads a C1 control as cp1252


def _dataset(texts):
    n = len(texts)
    return datasets.Dataset.from_dict(
        {"id": [f"d{i}" for i in range(n)], "text": texts, "label": ["x"] * n, "source_split": [""] * n}
    )


def test_drops_are_counted_by_reason(tmp_path):
    texts = [
        "a perfectly fine text",  # kept
        "  \u200b ",  # empty_after_clean
        "<br />",  # empty_after_clean
        "ab",  # too_short (min_chars 3)
        "word " * 30,  # too_long (max_chars 60)
        "single",  # too_few_words
        "@someone http://t.co/x",  # too_few_words: placeholder tokens are not words
        "RT @a: two words",  # kept after the marker goes
    ]
    cfg = dataclasses.replace(DEFAULT, min_chars=3, max_chars=60, min_words=2)
    result = clean(_dataset(texts), cfg, StageContext(out_dir=tmp_path))
    assert result.dropped == {"empty_after_clean": 2, "too_short": 1, "too_long": 1, "too_few_words": 2}
    assert result.data["id"][:] == ["d0", "d7"]
    assert result.data["text"][:] == ["a perfectly fine text", "two words"]
    assert result.data.column_names == ["id", "text", "label", "source_split"]


def test_mojibake_counts_in_stats(tmp_path):
    result = clean(_dataset(["cafÃ©", "plain", "GoogleÕ¢_\x8aÎ_\x86¢s x"]), DEFAULT, StageContext(out_dir=tmp_path))
    assert result.stats == {"mojibake_repaired": 2, "mojibake_suspect_after": 1}


@pytest.mark.slow
def test_parallel_map_gives_the_same_rows(tmp_path):
    texts = [f"RT @u{i}: text number {i} <br /> http://x.co/{i} &amp;" for i in range(10_000)]
    ds = _dataset(texts)
    one = clean(ds, DEFAULT, StageContext(out_dir=tmp_path, num_proc=1)).data
    two = clean(ds, DEFAULT, StageContext(out_dir=tmp_path, num_proc=2)).data
    assert one["text"][:] == two["text"][:]
    assert one["text"][7] == "text number 7 [url] &"


def test_impossible_length_filters_are_rejected_when_the_config_loads():
    with pytest.raises(ValueError, match=r"clean.max_chars \(5\) is below clean.min_chars \(10\)"):
        load_config(None, ["clean.min_chars=10", "clean.max_chars=5"])


def test_everything_dropped_leaves_zero_rows_and_the_counts(tmp_path):
    """The runner turns zero rows into an error naming the stage; clean reports why they went."""
    result = clean(_dataset(["<br />", "\u200b", "one"]), dataclasses.replace(DEFAULT, min_words=2), StageContext(out_dir=tmp_path))
    assert result.data.num_rows == 0
    assert result.dropped == {"empty_after_clean": 2, "too_few_words": 1}
