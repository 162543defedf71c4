"""Training state as JSON and safetensors only: nothing in a checkpoint is ever unpickled.

accelerate's save_state writes the optimizer, scheduler and RNG states with torch.save (pickles),
and its load_state swallows a failed RNG restore as an info log line. Both break a promise of
ours (no unpickling; a failed RNG restore is an error), so these few states have their own
formats: tensors go to safetensors, everything else to JSON, and every restore is checked.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifacts import read_json, write_json_atomic


# ---------------------------------------------------------------- RNG states (one file per process)


def _b64(t) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _tensor_from_b64(text: str):
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state() -> dict:
    """python, numpy and torch (CPU and every CUDA device) generator states as JSON values."""
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch_cpu": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict, where: str) -> None:
    """Restore what rng_state() returned; any missing or malformed part is an error naming `where`."""
    import torch

    try:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
        n = state["numpy"]
        np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
        torch.set_rng_state(_tensor_from_b64(state["torch_cpu"]))
        if torch.cuda.is_available():
            cuda = state.get("torch_cuda")
            if cuda is None or len(cuda) != torch.cuda.device_count():
                raise ValueError(f"saved CUDA RNG states for {len(cuda or [])} devices, "
                                 f"this process sees {torch.cuda.device_count()}")
            torch.cuda.set_rng_state_all([_tensor_from_b64(s) for s in cuda])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{where}: cannot restore the random number generator state ({e}); "
                         f"resuming without it would not reproduce the run") from None


# ---------------------------------------------------------------- optimizer: tensors + JSON skeleton


def save_optimizer(opt_state: dict, tensors_path: Path, json_path: Path) -> None:
    """torch optimizer state_dict -> safetensors (per-parameter tensors) + JSON (groups, scalars)."""
    import torch
    from safetensors.torch import save_file

    tensors, skeleton = {}, {}
    for pid, per_param in opt_state["state"].items():
        entry = {}
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
                entry[key] = {"tensor": f"{pid}.{key}"}
            else:
                entry[key] = {"value": value}
        skeleton[str(pid)] = entry
    save_file(tensors, str(tensors_path))
    write_json_atomic(json_path, {"state": skeleton, "param_groups": opt_state["param_groups"]})


def load_optimizer(tensors_path: Path, json_path: Path) -> dict:
    """The inverse of save_optimizer; lists in param_groups (betas) come back as tuples."""
    from safetensors.torch import load_file

    tensors = load_file(str(tensors_path))
    meta = read_json(json_path)
    state = {}
    for pid, entry in meta["state"].items():
        state[int(pid)] = {k: tensors[v["tensor"]] if "tensor" in v else v["value"] for k, v in entry.items()}
    groups = [{k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
              for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------- scheduler and gradient scaler


def plain_state(state: dict, where: str) -> dict:
    """A scheduler/scaler state_dict checked to be plain JSON data (a LambdaLR with a plain function
    stores None for it; anything else would need pickling, which we refuse)."""
    try:
        return json.loads(json.dumps(state, allow_nan=True))
    except TypeError as e:
        raise ValueError(f"{where}: state is not plain data and cannot be checkpointed safely: {e}") from None


def read_plain(path: Path) -> Any:
    return read_json(path)
