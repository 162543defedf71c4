"""Checkpoints: verification, fallback past corrupt ones, rotation, resolve_checkpoint, mismatch
errors, and a planted malicious pickle that must never run."""

from __future__ import annotations

import pickle

import pytest
from trainkit import run_dir

from pipeline import artifacts
from pipeline.config import load_config
from pipeline.training import checkpoint, signals
from pipeline.training.loop import train
from pipeline.training.setup import check_resumable


def _fake(root, name: str, step: int, metrics: dict | None = None, complete: bool = True):
    d = root / name
    d.mkdir(parents=True)
    artifacts.write_json_atomic(d / "state.json", {"step": step, "metrics": metrics or {},
                                                   "best": {"metric": "accuracy", "greater_is_better": True}})
    (d / "model.safetensors").write_bytes(b"x" * 10)
    if complete:
        files = {p.name: {"bytes": p.stat().st_size, "sha256": artifacts.file_sha256(p)} for p in d.iterdir()}
        artifacts.write_json_atomic(d / "manifest.json", {"files": files})
    return d


def test_rotation_keeps_newest_and_best_and_clears_temporaries(tmp_path):
    root = tmp_path / "checkpoints"
    accs = {10: 0.5, 20: 0.9, 30: 0.7, 40: 0.6, 50: None, 60: 0.4}
    for step, acc in accs.items():
        _fake(root, f"step-{step:07d}", step, {"accuracy": acc} if acc is not None else {})
    (root / ".step-0000070.tmp").mkdir()
    removed = checkpoint.rotate(root, keep_last=2, keep_best=1)
    assert {p.name for p in root.iterdir()} == {"step-0000020", "step-0000050", "step-0000060"}
    assert len(removed) == 4
    checkpoint.rotate(root, keep_last=0, keep_best=0)  # never deletes the newest complete one
    assert {p.name for p in root.iterdir()} == {"step-0000060"}


def test_resolve_checkpoint_names_and_errors(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        checkpoint.resolve_checkpoint(run, "last")
    _fake(run / "checkpoints", "step-0000010", 10, {"accuracy": 0.8})
    _fake(run / "checkpoints", "step-0000020", 20, {"accuracy": 0.6})
    _fake(run / "checkpoints", "step-0000030", 30, complete=False)
    assert checkpoint.resolve_checkpoint(run, "last").name == "step-0000020"
    assert checkpoint.resolve_checkpoint(run, "best").name == "step-0000010"
    with pytest.raises(FileNotFoundError, match="step-0000010, step-0000020"):
        checkpoint.resolve_checkpoint(run, "final")
    with pytest.raises(ValueError, match="incomplete"):
        checkpoint.resolve_checkpoint(run, str(run / "checkpoints" / "step-0000030"))
    with pytest.raises(FileNotFoundError, match="not found"):
        checkpoint.resolve_checkpoint(run, str(run / "nope"))
    assert checkpoint.model_config_dir(run / "checkpoints" / "step-0000010") == run / "model_config"


def test_find_resume_passes_over_corrupt_and_incomplete(tmp_path):
    root = tmp_path / "checkpoints"
    _fake(root, "step-0000010", 10)
    bad = _fake(root, "step-0000020", 20)
    _fake(root, "step-0000030", 30, complete=False)
    (bad / "model.safetensors").write_bytes(b"y" * 10)  # same size, other bytes
    path, warnings = checkpoint.find_resume(root)
    assert path.name == "step-0000010"
    assert any("step-0000030" in w and "incomplete" in w for w in warnings)
    assert any("step-0000020" in w and "sha256" in w for w in warnings)
    (root / "step-0000010" / "model.safetensors").write_bytes(b"x" * 3)  # truncated
    assert checkpoint.verify(root / "step-0000010").startswith("model.safetensors has 3 bytes")


def test_mismatched_resume_is_an_error(tmp_path):
    fps = {"model": "m1", "data": "d1", "train": {"batch_size": 8, "seed": 1}}
    state = {"num_processes": 1, "fingerprints": fps}
    check_resumable(state, fps, 1, tmp_path)
    with pytest.raises(ValueError, match="saved by 1 processes, this run has 2"):
        check_resumable(state, fps, 2, tmp_path)
    with pytest.raises(ValueError, match=r"other the \[model\] section"):
        check_resumable(state, {**fps, "model": "m2"}, 1, tmp_path)
    with pytest.raises(ValueError, match="other the prepared data"):
        check_resumable(state, {**fps, "data": "d2"}, 1, tmp_path)
    with pytest.raises(ValueError, match="train.batch_size: 8 -> 16"):
        check_resumable(state, {**fps, "train": {"batch_size": 16, "seed": 1}}, 1, tmp_path)


class _Evil:
    """Unpickling this creates the marker file: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(ckpt, name: str, payload: bytes) -> None:
    (ckpt / name).write_bytes(payload)
    man = artifacts.read_json(ckpt / "manifest.json")
    man["files"][name] = {"bytes": len(payload), "sha256": artifacts.file_sha256(ckpt / name)}
    artifacts.write_json_atomic(ckpt / "manifest.json", man)  # made to look complete and intact


def test_planted_pickles_never_run_and_corrupt_newest_falls_back(prepared, fresh_accelerate, tmp_path, capsys):
    config = prepared(train={"epochs": 1, "save_every": 10, "keep_last": 3})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    run = run_dir(config)
    ckpts = [p for p, _ in checkpoint.complete_checkpoints(run / "checkpoints")]
    assert [p.name for p in ckpts] == ["step-0000010", "step-0000020"]
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Evil(marker))
    for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl", "scaler.pt"):
        _plant(ckpts[0], name, evil)
    _plant(ckpts[1], "model.safetensors", evil)  # a pickle where the weights should be
    cfg2 = load_config(config, ["train.epochs=2"])
    with pytest.raises(ValueError, match="cannot load"):
        train(cfg2, str(config), resume=str(ckpts[1]))
    assert not marker.exists()
    (ckpts[1] / "optimizer.safetensors").write_bytes(b"")  # now also visibly corrupt: auto passes over it
    assert train(cfg2, str(config), resume="auto") == signals.EXIT_OK
    out = capsys.readouterr()
    assert f"skipping corrupt checkpoint {ckpts[1]}" in out.err
    assert "resuming from" in out.out and "step-0000010" in out.out
    assert not marker.exists()
