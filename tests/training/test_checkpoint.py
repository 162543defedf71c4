"""Checkpoints: verification, fallback past corrupt ones, rotation, resolve_checkpoint, mismatch
errors, and a planted malicious pickle that must never run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from pipeline import artifacts
from pipeline.checks import load_config
from pipeline.training import checkpoint, signals
from pipeline.training.loop import train
from pipeline.training.setup import check_resumable
from pipeline.training.state_io import TrainState
from tests.training.trainkit import run_dir


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


def _sharded(root, name: str, step: int):
    """A checkpoint laid out as FSDP's save_state leaves it: DCP folders with one shard per rank."""
    d = _fake(root, name, step, complete=False)
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        (d / folder).mkdir()
        for f, data in ((".metadata", b"m" * 7), ("__0_0.distcp", b"a" * 20), ("__1_0.distcp", b"b" * 20)):
            (d / folder / f).write_bytes(data)
    checkpoint.write_manifest(d, kind="checkpoint")
    return d


@pytest.mark.parametrize("damage", ["truncated", "altered", "missing"])
def test_a_damaged_shard_makes_resume_fall_back(tmp_path, damage):
    root = tmp_path / "checkpoints"
    _sharded(root, "step-0000010", 10)
    newest = _sharded(root, "step-0000020", 20)
    assert "pytorch_model_fsdp_0/__1_0.distcp" in artifacts.read_json(newest / "manifest.json")["files"]
    shard = newest / "pytorch_model_fsdp_0" / "__1_0.distcp"  # rank 1's shard
    {"truncated": lambda: shard.write_bytes(b"b" * 5), "altered": lambda: shard.write_bytes(b"c" * 20),
     "missing": shard.unlink}[damage]()
    path, warnings = checkpoint.find_resume(root)
    assert path.name == "step-0000010"
    assert any("step-0000020" in w and "pytorch_model_fsdp_0/__1_0.distcp" in w for w in warnings), warnings
    _sharded(root, "step-0000030", 30)  # the next save; rotation then removes whole sharded folders
    checkpoint.rotate(root, keep_last=1, keep_best=0)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000030"]


def test_mismatched_resume_is_an_error(tmp_path):
    fps = {"model": "m1", "data": "d1", "train": {"batch_size": 8, "grad_accum": 2, "seed": 1}}
    state = TrainState.fresh("accuracy", True, 100, 2, fps)
    check_resumable(state, fps, 2, tmp_path)
    check_resumable(state, {**fps, "train": {**fps["train"], "batch_size": 16}}, 1, tmp_path)  # elastic: 8 x 2 = 16 x 1
    check_resumable(state, {**fps, "train": {**fps["train"], "batch_size": 4}}, 4, tmp_path)
    with pytest.raises(ValueError, match=r"global batch 8 x 2 x 2 \(batch_size x processes x grad_accum\) = 32 in the "
                                         r"checkpoint, 8 x 1 x 2 = 16 in this run; .*with 1 process\(es\) use train.batch_size=16"):
        check_resumable(state, fps, 1, tmp_path)
    with pytest.raises(ValueError, match="no train.batch_size gives it with 3 process"):
        check_resumable(state, fps, 3, tmp_path)
    with pytest.raises(ValueError, match="train.grad_accum: 2 -> 1"):  # same global batch, another data order
        check_resumable(state, {**fps, "train": {**fps["train"], "batch_size": 16, "grad_accum": 1}}, 2, tmp_path)
    with pytest.raises(ValueError, match=r"trained with other \[model\] settings"):
        check_resumable(state, {**fps, "model": "m2"}, 2, tmp_path)
    with pytest.raises(ValueError, match="trained with other prepared data"):
        check_resumable(state, {**fps, "data": "d2"}, 2, tmp_path)
    with pytest.raises(ValueError, match="train.seed: 1 -> 2"):
        check_resumable(state, {**fps, "train": {**fps["train"], "seed": 2}}, 2, tmp_path)


def test_an_extra_file_fails_verification(tmp_path):
    ckpt = _fake(tmp_path, "step-0000010", 10)
    assert checkpoint.verify(ckpt) is None
    (ckpt / "optimizer_0").mkdir()
    (ckpt / "optimizer_0" / ".metadata").write_bytes(b"x")
    assert checkpoint.verify(ckpt) == "optimizer_0/.metadata is not in the manifest"


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


# every file name a checkpoint can hold that some loader (accelerate, torch, FSDP, DeepSpeed) unpickles
PICKLE_NAMES = ("optimizer.bin", "scheduler.bin", "sampler.bin", "dl_state_dict.bin", "scaler.pt", "pytorch_model.bin",
                "random_states_0.pkl", "random_states_1.pkl", "pytorch_model_fsdp.bin", "pytorch_model_fsdp_0_rank0.bin",
                "optimizer_0_rank0.bin", "pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata",
                "pytorch_model/mp_rank_00_model_states.pt", "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                "pytorch_model/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "custom_checkpoint_0.pkl")
# and the names that are parsed as safetensors or JSON (a pickle there fails to parse)
PARSED_NAMES = ("model.safetensors", "scheduler.json", "rng_state_0.json")


def _plant(ckpt, name: str, payload: bytes) -> None:
    (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
    (ckpt / name).write_bytes(payload)
    man = artifacts.read_json(ckpt / "manifest.json")
    man["files"][name] = {"bytes": len(payload), "sha256": artifacts.file_sha256(ckpt / name)}
    artifacts.write_json_atomic(ckpt / "manifest.json", man)  # made to look complete and intact


def _restore(ckpt, saved: dict) -> None:
    for name, data in saved.items():
        (ckpt / name).write_bytes(data)
    files = {str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "sha256": artifacts.file_sha256(p)}
             for p in ckpt.rglob("*") if p.is_file() and p.name != "manifest.json"}
    artifacts.write_json_atomic(ckpt / "manifest.json", {"files": files})


def _reset_accelerate() -> None:
    from tests.accelkit import reset

    reset()


def test_planted_pickles_never_run_and_corrupt_newest_falls_back(prepared, fresh_accelerate, tmp_path, capsys):
    """A real checkpoint (save_state's files): a malicious pickle under every name any loader reads is
    refused before anything reads it, or fails to parse; the marker file proves nothing ran."""
    config = prepared(train={"epochs": 1, "save_every": 10, "keep_last": 3})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    run = run_dir(config)
    ckpts = [p for p, _ in checkpoint.complete_checkpoints(run / "checkpoints")]
    assert [p.name for p in ckpts] == ["step-0000010", "step-0000020"]
    assert {p.name for p in ckpts[1].iterdir()} == {"model.safetensors", "optimizer.bin", "random_states_0.pkl",
                                                    "scheduler.json", "rng_state_0.json", "state.json", "manifest.json"}
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Evil(marker))
    cfg2 = load_config(config, ["train.epochs=2"])
    refused = "cannot be read as data only|custom-object pickle|cannot load|not valid JSON|cannot restore|Expecting value"
    # train's resume path, end to end, for the first name; then the function it loads every checkpoint with
    # (checkpoint.load_checkpoint) for each name, on the run's prepared model, optimizer and scheduler
    from pipeline.training.setup import prepare_run

    for i, name in enumerate(PICKLE_NAMES + PARSED_NAMES):
        saved = {n: (ckpts[1] / n).read_bytes() for n in PARSED_NAMES}
        _plant(ckpts[1], name, evil)
        if i == 0:
            with pytest.raises(ValueError, match=refused):
                train(cfg2, str(config), resume=str(ckpts[1]))
            _reset_accelerate()
            s, _ = prepare_run(cfg2, str(config), str(ckpts[0]))  # the older, intact checkpoint loads
        else:
            with pytest.raises(ValueError, match=refused):
                checkpoint.load_checkpoint(s.acc, ckpts[1], s.model, s.optimizer, s.scheduler)
        assert not marker.exists(), name
        (ckpts[1] / name).unlink()
        _restore(ckpts[1], saved)
    s.acc.end_training()
    _reset_accelerate()
    _plant(ckpts[1], "optimizer.bin", evil)
    (ckpts[1] / "model.safetensors").write_bytes(b"")  # now also visibly corrupt: auto passes over it
    assert train(cfg2, str(config), resume="auto") == signals.EXIT_OK
    out = capsys.readouterr()
    assert f"skipping corrupt checkpoint {ckpts[1]}" in out.err
    assert "resuming from" in out.out and "step-0000010" in out.out
    assert not marker.exists()


# ---------------------------------------------------------------- FSDP2, for real, on CPU processes


def _fsdp(processes: int, mode: str, out: Path) -> str:
    """fsdp_on_cpu.py as `torchrun --nproc_per_node PROCESSES` runs it (its ranks forked from the zygote:
    trainkit.fork_ranks); rank 0's output."""
    from tests.zygote import child_env, fork_ranks, wait_ranks

    env = {**os.environ, **child_env(), "ACCELERATE_USE_CPU": "true"}
    ranks = fork_ranks([Path(__file__).with_name("fsdp_on_cpu.py"), mode, out], processes, out / mode, env)
    codes = wait_ranks(ranks)
    logs = [(out / f"{mode}-{r}.log").read_text(errors="replace") for r in range(processes)]
    assert codes == [0] * processes, "".join(logs)[-4000:]
    return logs[0]


@pytest.fixture(scope="module")
def fsdp_chains(tmp_path_factory):
    """fsdp_on_cpu.py's two chains (plain, then LoRA in lora/) in one pair of gloo processes."""
    out = tmp_path_factory.mktemp("fsdp")
    _fsdp(2, "chains", out)
    return out


@pytest.mark.slow
def test_fsdp2_sharded_checkpoints_through_accelerate_on_cpu(fsdp_chains):
    """accelerate's own FSDP2 code (fully_shard, DCP save/load, full-state gather) on 2 gloo processes,
    through save_checkpoint/load_checkpoint: every rank's shard in the manifest, verified; a resume
    equal (==) to the uninterrupted run; evaluation's load_weights reads the shards without a process
    group; final/ holds the gathered full weights; a planted DCP .metadata is refused; and 2 -> 1
    processes re-shards (DCP) within fp32 tolerance."""
    import json

    out = fsdp_chains
    r = json.loads((out / "results.json").read_text())
    assert r["resumed"] == r["ref"] and len(set(r["ref"])) == 6
    assert r["verify"] is None and r["loaded_equal"] and r["end_equal"] and r["eval_equal"] and r["eval_keys_equal"]
    assert r["final_equal"]  # final/: save_pretrained of the gathered full state dict, read back by transformers
    shards = {f"{d}/{f}" for d in ("pytorch_model_fsdp_0", "optimizer_0") for f in (".metadata", "__0_0.distcp", "__1_0.distcp")}
    assert shards | {"rng_state_0.json", "rng_state_1.json", "random_states_0.pkl", "random_states_1.pkl",
                     "scheduler.json", "state.json"} == set(r["files"])
    log = _fsdp(1, "resume1", out)
    assert "saved by 2 processes, this run has 1" in log
    got = json.loads((out / "resume1.json").read_text())
    assert got["lr"] == r["lr"] and max(abs(a - b) for a, b in zip(got["resumed"], r["ref"][3:])) <= 1e-5
    ckpt = out / "checkpoints" / "step-3"
    marker = out / "pwned"
    _plant(ckpt, "pytorch_model_fsdp_0/.metadata", pickle.dumps(_Evil(marker)))
    assert checkpoint.verify(ckpt) is None  # looks intact: the manifest was rewritten to match
    with pytest.raises(ValueError, match=r"pytorch_model_fsdp_0/.metadata cannot be read as data only"):
        checkpoint.load_weights(ckpt, None)
    assert not marker.exists()


@pytest.mark.slow
def test_fsdp2_with_lora_resumes_exactly_and_exports_the_merged_model(fsdp_chains):
    """FSDP2 shards a LoRA model (frozen base, trained adapters and head) on 2 gloo processes: the resume
    equals the uninterrupted run, evaluation reads the shards into a plain adapted model, and final/ is the
    merged model. (Under FSDP the checkpoint is accelerate's sharded DCP of the whole model: save_state's
    FSDP path takes no pre-hook, so it is not cut down to what trains.)"""
    import json

    r = json.loads((fsdp_chains / "lora" / "results.json").read_text())
    assert r["resumed"] == r["ref"] and len(set(r["ref"])) == 6
    assert r["verify"] is None and r["loaded_equal"] and r["end_equal"] and r["eval_equal"] and r["eval_keys_equal"]
    assert r["final_equal"]


# ---------------------------------------------------------------- the data a checkpoint trained on, by content


def _record_data(ckpt: Path, data_fp: str) -> None:
    """Rewrite the data fingerprint a checkpoint recorded (and its manifest), as an older version wrote it."""
    state = artifacts.read_json(ckpt / checkpoint.STATE)
    state["fingerprints"]["data"] = data_fp
    artifacts.write_json_atomic(ckpt / checkpoint.STATE, state)
    (ckpt / artifacts.MANIFEST).unlink()
    checkpoint.write_manifest(ckpt, "checkpoint")


def test_a_checkpoint_that_recorded_an_older_versions_data_fingerprint_resumes_on_the_same_content(
        prepared, fresh_accelerate, tmp_path):
    """An older version recorded the tokenize stage's folder fingerprint, which hashes the code that made
    it; an upgrade rebuilds the same bytes under a new name. The old folder is compared by content: the
    same data resumes to the uninterrupted run's weights, other data is refused naming both."""
    import shutil

    from safetensors.torch import load_file

    config = prepared(train={"epochs": 1, "save_every": 10, "keep_last": 3})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    run = run_dir(config)
    whole = load_file(run / "final" / "model.safetensors")
    stage = Path(artifacts.read_json(run.parent / "data" / "prepared.json")["stage_dir"])
    legacy = stage.with_name("5-tokenize-00000000000000aa")
    shutil.copytree(stage, legacy)  # the older version's folder of the same data
    ckpt = run / "checkpoints" / "step-0000010"
    for later in (run / "checkpoints" / "step-0000020", run / "final"):
        shutil.rmtree(later)
    _record_data(ckpt, "00000000000000aa")
    assert train(load_config(config), str(config), resume=str(ckpt)) == signals.EXIT_OK
    resumed = load_file(run / "final" / "model.safetensors")
    assert resumed.keys() == whole.keys() and all(resumed[k].equal(whole[k]) for k in whole)

    other = legacy.with_name("5-tokenize-00000000000000bb")
    shutil.copytree(legacy, other)
    (other / "tokenizer" / "tokenizer.json").write_text("{}")  # other content
    _record_data(ckpt, "00000000000000bb")
    with pytest.raises(ValueError, match=r"trained with other prepared data \(fingerprint 00000000000000bb != "):
        train(load_config(config), str(config), resume=str(ckpt))
