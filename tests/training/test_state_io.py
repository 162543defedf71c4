"""RNG states round-trip exactly through JSON, and a broken one is an error, not a log line; every
pickle a checkpoint can hold is read as data only, and planted code never runs."""

from __future__ import annotations

import io
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.artifacts import write_json_atomic
from pipeline.training import state_io


def test_rng_state_round_trips_all_generators():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = state_io.rng_state()
    want = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    state_io.set_rng_state(saved, "test")
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])


def test_broken_rng_state_is_an_error():
    saved = state_io.rng_state()
    del saved["numpy"]
    with pytest.raises(ValueError, match="rng_state_0.json: cannot restore"):
        state_io.set_rng_state(saved, "rng_state_0.json")
    saved = state_io.rng_state()
    saved["torch_cpu"] = "AAAA"
    with pytest.raises(ValueError, match="cannot restore"):
        state_io.set_rng_state(saved, "x")


class _Evil:
    """Unpickling this creates the marker file: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_real_states_pass_the_data_only_check(tmp_path):
    """What accelerate's save_state and torch's DCP really write: optimizer, RNG (numpy arrays inside),
    scaler-like dicts, and a DCP folder's .metadata, all readable as data only."""
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "optimizer.bin")
    torch.save({"step": 3, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state()}, tmp_path / "random_states_0.pkl")
    torch.save({"scale": 65536.0, "growth_factor": 2.0, "_growth_tracker": 0}, tmp_path / "scaler.pt")
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "pytorch_model_fsdp_0"), no_dist=True)
    state_io.check_no_code(tmp_path)  # no error


@pytest.mark.parametrize("name", ["optimizer.bin", "random_states_0.pkl", "scaler.pt", "pytorch_model_fsdp.bin",
                                  "pytorch_model/mp_rank_00_model_states.pt", "optimizer_0/.metadata"])
@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_planted_code_is_refused_before_anything_reads_it(tmp_path, name, how):
    marker = tmp_path / "pwned"
    path = tmp_path / "ckpt" / name
    path.parent.mkdir(parents=True)
    if how == "pickle":
        path.write_bytes(pickle.dumps(_Evil(marker)))
    else:
        buffer = io.BytesIO()
        torch.save(_Evil(marker), buffer)  # the zip format torch.load reads
        path.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match=f"{name} cannot be read as data only"):
        state_io.check_no_code(tmp_path / "ckpt")
    assert not marker.exists()


def test_dcp_metadata_unpickler_knows_exact_names_only(tmp_path):
    """A dotted global reaches through a module's imports (metadata.os.system): refused by name."""
    payload = b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x94\x8c\tos.system\x94\x93\x94."
    (tmp_path / ".metadata").write_bytes(payload)
    with pytest.raises(ValueError, match=r"\.metadata cannot be read as data only \(UnpicklingError: refused global"):
        state_io.check_no_code(tmp_path)


def test_accelerate_custom_object_pickles_are_refused(tmp_path):
    torch.save({"a": 1}, tmp_path / "custom_checkpoint_0.pkl")  # harmless content, refused by name
    with pytest.raises(ValueError, match="custom_checkpoint_0.pkl is an accelerate custom-object pickle"):
        state_io.check_no_code(tmp_path)


def test_scheduler_with_a_callable_object_is_refused():
    with pytest.raises(ValueError, match="cannot be checkpointed safely"):
        state_io.plain_state({"lr_lambdas": [object()]}, "scheduler")


# ---------------------------------------------------------------- the training state (state.json)

FORMAT1 = Path(__file__).parent / "data" / "state_format1.json"  # written by the loop before TrainState existed


def test_a_state_json_of_todays_format_loads_and_is_written_back_byte_for_byte(tmp_path):
    st = state_io.TrainState.read(FORMAT1)
    assert (st.step, st.epoch, st.batch_in_epoch, st.total_steps, st.num_processes) == (12, 0, 12, 12, 1)
    assert st.best == state_io.Best("loss", False, 1.1049571562853993, 4)
    assert st.nan == state_io.NanCount(0, 0) and st.metrics["accuracy"] == 0.3125
    assert st.fingerprints["train"]["batch_size"] == 8
    assert st.patience == state_io.Patience(None, 0)  # written before early stopping: its default
    write_json_atomic(tmp_path / "state.json", st.to_json())  # what checkpoint.save_checkpoint writes
    written, before = json.loads((tmp_path / "state.json").read_text()), json.loads(FORMAT1.read_text())
    assert written == {**{k: v for k, v in before.items() if k != "format"}, "patience": {"value": None, "stale": 0},
                       "format": before["format"]} and list(written)[-2:] == ["patience", "format"]
    del written["patience"]
    write_json_atomic(tmp_path / "old.json", written)
    assert (tmp_path / "old.json").read_bytes() == FORMAT1.read_bytes()  # every other byte as it was


def test_a_fresh_state_round_trips_and_decides_the_direction_once():
    st = state_io.TrainState.fresh("macro_f1", True, 30, 2, {"model": "m", "data": "d", "train": {}})
    assert st.best.greater_is_better and not state_io.Best.of("loss", False).greater_is_better
    st.best.offer(0.5, 3), st.best.offer(0.4, 6)
    assert (st.best.value, st.best.step) == (0.5, 3)
    low = state_io.Best.of("loss", False)
    low.offer(0.5, 3), low.offer(0.4, 6)
    assert (low.value, low.step) == (0.4, 6)
    back = state_io.TrainState.from_json(json.loads(json.dumps(st.to_json())), "x")
    assert back == st and list(st.to_json()) == ["step", "epoch", "batch_in_epoch", "total_steps", "metrics", "best",
                                                 "nan", "num_processes", "fingerprints", "patience", "format"]


def _broken(edit) -> dict:
    obj = json.loads(FORMAT1.read_text())
    edit(obj)
    return obj


@pytest.mark.parametrize("edit, message", [
    (lambda o: o.pop("batch_in_epoch"), r"state.json: missing key 'batch_in_epoch'$"),
    (lambda o: o["nan"].pop("in_a_row"), r"state.json: missing key 'nan.in_a_row'$"),
    (lambda o: o.update(step="12"), r"state.json: key 'step' must be an integer, got '12'$"),
    (lambda o: o.update(step=12.0), r"state.json: key 'step' must be an integer, got 12.0$"),
    (lambda o: o["best"].update(greater_is_better=1), r"key 'best.greater_is_better' must be true or false, got 1$"),
    (lambda o: o["best"].update(value="high"), r"key 'best.value' must be a number or null, got 'high'$"),
    (lambda o: o["best"].update(step=True), r"key 'best.step' must be an integer or null, got True$"),
    (lambda o: o.update(best=None), r"state.json: key 'best' must be an object, got None$"),
    (lambda o: o.update(metrics=[]), r"key 'metrics' must be an object, got \[\]$"),
    (lambda o: o.update(epochs=1), r"state.json: unknown key 'epochs'$"),
    (lambda o: o.pop("format"), r"state.json is in an older checkpoint format \(safetensors \+ JSON, before save_st"),
])
def test_a_missing_or_mistyped_key_is_one_line_naming_file_and_key(edit, message):
    with pytest.raises(ValueError, match=message) as e:
        state_io.TrainState.from_json(_broken(edit), "run/checkpoints/step-0000012/state.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("run/checkpoints/step-0000012/state.json")


def test_a_state_json_that_is_not_an_object_is_named():
    with pytest.raises(ValueError, match=r"^x/state.json: the state must be an object, got list$"):
        state_io.TrainState.from_json([1, 2], "x/state.json")
