"""RNG and optimizer states round-trip exactly through JSON and safetensors; a broken RNG state is
an error, not a log line."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

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


def test_optimizer_state_round_trips_exactly(tmp_path):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    state_io.save_optimizer(opt.state_dict(), tmp_path / "o.safetensors", tmp_path / "o.json")
    loaded = state_io.load_optimizer(tmp_path / "o.safetensors", tmp_path / "o.json")
    opt2 = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters(), lr=1.0)
    opt2.load_state_dict(loaded)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for pid in a["state"]:
        for k, v in a["state"][pid].items():
            assert torch.equal(v, b["state"][pid][k])


def test_scheduler_with_a_callable_object_is_refused():
    with pytest.raises(ValueError, match="cannot be checkpointed safely"):
        state_io.plain_state({"lr_lambdas": [object()]}, "scheduler")
