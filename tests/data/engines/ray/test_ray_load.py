"""The load stage on Ray (pipeline/data/engines/ray/load.py): every format read in parts by tasks gives the
local engine's rows, ids, drop counts and stats at 1, 2 and 7 blocks, and its one-line errors; the
driver never reads the source's rows."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import RayConfig, SourceConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.data.io import formats, parts, readers
from pipeline.data.stages import load

SPLITS = ["train", " Dev ", "test", "valid", ""]


def _records(n: int = 60) -> list[dict]:
    """Texts with copies far apart (content ids -2, -3 across parts), empty texts, split names to normalise."""
    out = []
    for k in range(n):
        text = f"doc {k % 17} é, word" if k % 5 else ("" if k % 10 == 0 else "   ")
        out.append({"text": text, "label": ["neg", "pos"][k % 2], "split": SPLITS[(k // 2) % 5], "key": f"k{k:03d}"})
    return out


def _write(tmp_path: Path, fmt: str, records: list[dict]) -> dict:
    """The records as a file of `fmt`; the SourceConfig fields that read it."""
    path = tmp_path / f"src.{fmt}"
    fields = {"format": fmt, "path": str(path), "split_field": "split"}
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif fmt in ("csv", "tsv", "csv-quoted"):
        fields["format"] = fmt.split("-")[0]
        with open(path, "w", newline="", encoding="utf-8") as f:
            quoting = csv.QUOTE_ALL if fmt == "csv-quoted" else csv.QUOTE_NONE
            w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",", quoting=quoting, escapechar="\\")
            w.writerow(["text", "label", "split"])
            w.writerows([[r["text"].replace(",", ";"), r["label"], r["split"]] for r in records])
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=7)
    else:  # folder: root/<label>/<key>.txt, ids are the relative paths
        for r in records:
            (tmp_path / "folder" / r["label"]).mkdir(parents=True, exist_ok=True)
            (tmp_path / "folder" / r["label"] / f"{r['key']}.txt").write_text(r["text"], encoding="utf-8")
        fields = {"format": "folder", "path": str(tmp_path / "folder")}
    return fields


def _engine(blocks: int):
    from pipeline.data.engines.ray.engine import RayEngine

    return RayEngine.connect(RayConfig(blocks=blocks))


def _load(cfg: SourceConfig, engine, tmp_path: Path) -> tuple:
    """(features, rows, schema, dropped, stats) of the load stage, or the one-line error it raised."""
    folder = tmp_path / f"stage-{engine.name}-{getattr(engine.cfg, 'blocks', 0) if engine.name == 'ray' else 0}"
    with engine.stage(folder):
        try:
            r = load.load(None, cfg, StageContext(out_dir=folder, engine=engine))
        except ValueError as e:
            return ("error", str(e))
        return r.data.features, r.data.to_list(), r.data.data.table.schema, r.dropped, r.stats


def _same(cfg: SourceConfig, blocks: int, tmp_path: Path) -> tuple:
    local = _load(cfg, LocalEngine(), tmp_path)
    assert _load(cfg, _engine(blocks), tmp_path) == local
    return local


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 2, 7])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "csv-quoted", "tsv", "parquet", "folder"])
def test_every_format_read_in_parts_equals_the_local_read(tmp_path, ray_cluster, fmt, blocks):
    fields = _write(tmp_path, fmt, _records())
    local = _same(SourceConfig(**fields), blocks, tmp_path)
    features, rows, _, dropped, stats = local
    assert len(rows) == 48 and stats["rows_read"] == 60 and dropped == {"empty": 12}
    if fmt != "folder":  # the same text 17 and 34 rows later: numbered in the file's order, across parts
        ids = [r["id"] for r in rows if r["text"].startswith("doc 1 ")]
        assert ids[0] + "-2" == ids[1] and ids[0] + "-3" == ids[2]
        assert {r["source_split"] for r in rows} == {"train", "validation", "test", ""}
    sampled = _same(SourceConfig(**fields, sample=0.5, max_rows=41), blocks, tmp_path)
    assert 0 < len(sampled[1]) < len(rows) and sampled[3]["not_sampled"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [2, 7])
def test_max_rows_is_a_prefix_of_the_file_across_parts(tmp_path, ray_cluster, blocks):
    lines = [json.dumps({"text": f"t{k}"}) for k in range(40)]
    lines[10], lines[30] = "{broken", "{broken too"  # one within the first 25 records, one after them
    (path := tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    skip = _same(SourceConfig(format="jsonl", path=str(path), label_field="", max_rows=25, bad_lines="skip"),
                 blocks, tmp_path)
    assert [r["text"] for r in skip[1]] == [f"t{k}" for k in range(26) if k != 10]
    assert skip[3] == {"bad_line": 1} and skip[4]["rows_read"] == 25
    short = _same(SourceConfig(format="jsonl", path=str(path), label_field="", max_rows=9), blocks, tmp_path)
    assert len(short[1]) == 9  # the bad lines lie past the prefix: no error, as one read stops before them
    failed = _same(SourceConfig(format="jsonl", path=str(path), label_field="", max_rows=25), blocks, tmp_path)
    assert failed == ("error", f"{path}:11: not valid JSON (Expecting property name enclosed in double quotes at "
                               f"column 2); fix the line or set source.bad_lines=skip")


@pytest.mark.slow
def test_a_bad_line_in_the_middle_of_a_part_names_the_file_and_its_line(tmp_path, ray_cluster):
    lines = [json.dumps({"text": f"t{k}", "label": "x"}) for k in range(100)]
    lines[72] = '{"text": {"nested": 1}, "label": "x"}'
    (path := tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    cfg = SourceConfig(format="jsonl", path=str(path))
    assert len(formats.plan_parts(path, cfg, 7)) == 7
    assert _same(cfg, 7, tmp_path) == ("error", f"{path}:73: field 'text' holds a JSON dict, expected text; "
                                                f"fix the line or set source.bad_lines=skip")


@pytest.mark.slow
def test_the_files_bytes_are_checked_before_its_records_whatever_part_holds_them(tmp_path, ray_cluster):
    lines = [json.dumps({"text": f"t{k}"}) for k in range(60)]
    lines[3] = "not json"
    (path := tmp_path / "d.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "a\0b"}\n')
    error = _same(SourceConfig(format="jsonl", path=str(path), label_field=""), 7, tmp_path)
    assert error[0] == "error" and "a NUL byte at offset" in error[1]


@pytest.mark.slow
def test_a_repeated_id_across_two_parts_is_the_local_one_line_error(tmp_path, ray_cluster):
    records = [{"text": f"t{k}", "id": f"id{k}"} for k in range(50)]
    records[45]["id"] = records[2]["id"] = "same"
    records[40]["id"] = "id7"
    (path := tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    error = _same(SourceConfig(format="jsonl", path=str(path), label_field="", id_field="id"), 2, tmp_path)
    assert error == ("error", f"{path}: ids in column 'id' (source.id_field) must be unique; 2 repeat: "
                              f"'same' (2 rows), 'id7' (2 rows); fix them, or set source.id_field: '' to derive "
                              f"ids from the text")
    records[40]["id"], records[45]["id"] = " ", "id45"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "1 rows have an empty id" in _same(SourceConfig(format="jsonl", path=str(path), label_field="",
                                                           id_field="id"), 2, tmp_path)[1]


@pytest.mark.slow
def test_jsonl_parts_whose_types_disagree_are_all_read_as_one_read_would(tmp_path, ray_cluster):
    """Labels 1.0 (a number) in the first half, strings in the second: pyarrow cannot parse the whole
    file, so one read uses the line reader ("1.0"); each half alone would parse ("1")."""
    records = [{"text": f"t{k}", "label": 1.0 if k < 20 else "x"} for k in range(40)]
    (path := tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    local = _same(SourceConfig(format="jsonl", path=str(path)), 2, tmp_path)
    assert local[1][0]["label"] == "1.0"


@pytest.mark.slow
def test_the_driver_never_reads_the_sources_rows(tmp_path, ray_cluster, monkeypatch):
    fields = _write(tmp_path, "jsonl", _records())
    expected = _load(SourceConfig(**fields), LocalEngine(), tmp_path)

    def not_here(*_, **__):
        raise AssertionError("the driver read the source's rows")

    for name in ("read_jsonl", "read_jsonl_lines", "read_csv", "read_parquet", "read_folder"):
        monkeypatch.setattr(readers, name, not_here)
    monkeypatch.setattr(formats, "read_part", not_here)  # in this process only: the tasks run in Ray's workers
    assert _load(SourceConfig(**fields), _engine(3), tmp_path) == expected
    with pytest.raises(AssertionError, match="the driver read"):
        _load(SourceConfig(**fields), LocalEngine(), tmp_path)


# ---------------------------------------------------------------- a quoted CSV read in parts (quote parity)


def _quoted_csv(tmp_path: Path, newline: str = "\n", rows: int = 200, extra: dict | None = None) -> Path:
    """A CSV whose values hold quoted line breaks (many lines long, so that cuts at line starts fall
    inside them), doubled quotes, commas, empty quoted values; `extra`: row -> raw line put instead."""
    kinds = ['plain {k}', 'two{nl}lines {k}', 'say "hi" {k}', '" {k}', 'a, b{nl}{nl}c {k}', '"{nl}"{nl} {k}',
             'x{nl}y{nl}z{nl}w {k}']
    lines = ["text,label,split"]
    for k in range(rows):
        value = kinds[k % len(kinds)].format(k=k, nl=newline).replace('"', '""')
        lines.append((extra or {}).get(k, f'"{value}",{["neg", "pos"][k % 2]},{SPLITS[k % 5].strip() or "train"}'))
    (path := tmp_path / "quoted.csv").write_bytes((newline.join(lines) + newline).encode())
    return path


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 2, 7])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_quoted_csv_read_in_parts_equals_the_local_read(tmp_path, ray_cluster, blocks, newline):
    path = _quoted_csv(tmp_path, newline)
    cfg = SourceConfig(format="csv", path=str(path), split_field="split")
    _, rows, _, dropped, stats = _same(cfg, blocks, tmp_path)
    assert len(rows) == 200 and stats["rows_read"] == 200 and not dropped
    assert rows[1]["text"] == f"two{newline}lines 1" and rows[2]["text"] == 'say "hi" 2'
    assert rows[5]["text"] == f'"{newline}"{newline} 5'
    capped = _same(dataclasses.replace(cfg, max_rows=123), blocks, tmp_path)
    assert [r["text"] for r in capped[1]] == [r["text"] for r in rows[:123]]


@pytest.mark.slow
def test_a_quoted_csv_is_really_read_in_parts_cut_at_record_starts(tmp_path, ray_cluster):
    from pipeline.data.engines.ray import load as ray_load

    path = _quoted_csv(tmp_path)
    cfg, engine = SourceConfig(format="csv", path=str(path), split_field="split"), _engine(7)
    lines = formats.plan_parts(path, cfg, 7)
    pieces, facts = ray_load._read(engine, ray_cluster, path, cfg, lines, engine.map_folder())
    assert len(pieces) == 7 and not any(f.quoted for f in facts) and sum(f.rows for f in facts) == 200
    moved = [(a.span[0], b.span[0]) for a, b in zip(lines, pieces) if a.span[0] != b.span[0]]
    assert moved and all(b > a for a, b in moved)  # cuts that fell inside a quoted value went to its record's end
    data = path.read_bytes()
    assert all(data[p.span[0] - 1: p.span[0]] == b"\n" for p in pieces[1:])


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [2, 7])
def test_a_bad_record_late_in_a_quoted_csv_names_its_physical_line(tmp_path, ray_cluster, blocks):
    path = _quoted_csv(tmp_path, extra={180: '"late,\nbad",neg,train,one too many'})
    line = path.read_bytes().split(b"\n").index(b'"late,') + 1
    cfg = SourceConfig(format="csv", path=str(path), split_field="split")
    assert _same(cfg, blocks, tmp_path) == ("error", f"{path}:{line}: Expected 3 columns, got 4; fix the row or "
                                                     f"set source.bad_lines=skip")
    skipped = _same(dataclasses.replace(cfg, bad_lines="skip"), blocks, tmp_path)
    assert skipped[3] == {"bad_line": 1} and len(skipped[1]) == 199


@pytest.mark.slow
def test_a_quote_the_parity_rule_does_not_model_reads_the_csv_as_one_part(tmp_path, ray_cluster):
    """`x"y` unquoted: pyarrow keeps the quote as a character, the count would take it as opening a
    quoted value: the parts find it (parts.parity_holds) and the file is read as one part."""
    from pipeline.data.engines.ray import load as ray_load

    path = _quoted_csv(tmp_path, extra={150: 'x"y,neg,train'})
    cfg, engine = SourceConfig(format="csv", path=str(path), split_field="split"), _engine(7)
    _, rows, *_ = _same(cfg, 7, tmp_path)
    assert len(rows) == 200 and rows[150]["text"] == 'x"y'
    pieces, _ = ray_load._read(engine, ray_cluster, path, cfg, formats.plan_parts(path, cfg, 7), engine.map_folder())
    assert pieces == [parts.WHOLE]


@pytest.mark.slow
def test_a_quoted_value_longer_than_a_part_joins_the_parts_it_spans(tmp_path, ray_cluster):
    from pipeline.data.engines.ray import load as ray_load

    long_value = "".join(f"line {k}, of a long value\n" for k in range(400))
    path = _quoted_csv(tmp_path, extra={100: f'"{long_value}",neg,train'})
    cfg, engine = SourceConfig(format="csv", path=str(path), split_field="split"), _engine(7)
    _, rows, *_ = _same(cfg, 7, tmp_path)
    assert len(rows) == 200 and rows[100]["text"] == long_value
    pieces, facts = ray_load._read(engine, ray_cluster, path, cfg, formats.plan_parts(path, cfg, 7), engine.map_folder())
    assert 1 < len(pieces) < 7 and not any(f.quoted for f in facts)  # the cuts inside the value went to its end


@pytest.mark.slow
def test_the_id_shuffle_has_the_engines_blocks_of_partitions_not_one_per_part(tmp_path, ray_cluster, monkeypatch):
    """12 parts on an engine of 3 blocks: 3 key partitions (12 x 3 shuffle outputs, not 12 x 12), and
    the content ids numbered and the repeated ids found across all 12 parts as one read finds them."""
    from pipeline.data.engines.ray import load as ray_load

    seen, real = [], ray_load.key_partitions
    monkeypatch.setattr(ray_load, "part_count", lambda engine: 12)
    monkeypatch.setattr(ray_load, "key_partitions", lambda *a: seen.append((a[1], real(*a))) or seen[-1][1])
    fields = _write(tmp_path, "jsonl", _records())
    rows = _same(SourceConfig(**fields), 3, tmp_path)[1]
    assert seen == [(12, 3)] and len(formats.plan_parts(Path(fields["path"]), SourceConfig(**fields), 12)) == 12
    ids = [r["id"] for r in rows if r["text"].startswith("doc 1 ")]
    assert ids[0] + "-2" == ids[1] and ids[0] + "-3" == ids[2]
    records = [{"text": f"t{k}", "id": f"id{k}"} for k in range(50)]
    records[49]["id"] = records[0]["id"] = "first and last"
    (path := tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    error = _same(SourceConfig(format="jsonl", path=str(path), label_field="", id_field="id"), 3, tmp_path)
    assert error[1].startswith(f"{path}: ids in column 'id' (source.id_field) must be unique; 1 repeat: "
                               f"'first and last' (2 rows)") and seen[-1] == (12, 3)
