"""What a part of a source is, and the byte-level rules of cutting one (pipeline/data/io/parts.py)."""

from pipeline.data.io import parts
from pipeline.schema import SourceConfig


def test_quote_parity_applies_to_the_csv_dialect_and_ascii_compatible_encodings(monkeypatch):
    assert parts.parity_applies(SourceConfig(format="csv", encoding="latin-1"))
    assert not parts.parity_applies(SourceConfig(format="tsv"))  # no quoting: cut at line starts already
    assert not parts.parity_applies(SourceConfig(format="csv", encoding="utf-16"))
    monkeypatch.setattr(parts, "csv_dialect", lambda cfg: {"newlines_in_values": True, "escape_char": "\\"})
    assert not parts.parity_applies(SourceConfig(format="csv"))  # an escaped quote is not counted: one part
