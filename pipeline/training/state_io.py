"""What a checkpoint may hold besides safetensors, read without ever running code from it: the
training state (state.json, typed and strictly checked), the RNG states, the scheduler, and the
pickles that accelerate and torch write, each proven to be data only before anything loads it.

accelerate's save_state writes the optimizer, scaler, sampler and RNG states with torch.save
(pickles), and under FSDP torch's distributed checkpoint (DCP) adds a plainly pickled `.metadata`
per sharded folder. A pickle can name any callable, so before accelerate or torch reads a
checkpoint, `check_no_code` reads every such file here through a loader that can only build data:
torch's weights-only unpickler (tensors, containers, numbers, the numpy types accelerate's RNG file
needs) or, for DCP metadata, an unpickler that knows only DCP's metadata classes. A file either
passes, and then the real load reads the same bytes, or resume refuses the checkpoint.
accelerate's `custom_checkpoint_<i>.pkl` (register_for_checkpointing) is loaded by accelerate with
weights_only=False, so it is refused outright: this project registers nothing.

accelerate's load_state also swallows a failed RNG restore as an info log line, so the RNG
states are kept a second time as JSON (`rng_state`/`set_rng_state`), restored last and checked.
"""

from __future__ import annotations

import base64
import json
import pickle
import random
import re
import types
import typing
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

import numpy as np

from pipeline.artifacts import read_json

FORMAT = "accelerate-save_state/1"  # state.json's "format": the layout checkpoint.py describes


# ---------------------------------------------------------------- the training state (state.json)


@dataclass
class Best:
    """The best validation value of metric_for_best so far, and the step that reached it."""

    metric: str
    greater_is_better: bool
    value: float | None = None
    step: int | None = None

    @classmethod
    def of(cls, metric: str, greater_is_better: bool, value: float | None = None, step: int | None = None) -> Best:
        return cls(metric, greater_is_better, value, step)  # the direction is the task's (Task.metrics)

    def offer(self, value: float, step: int) -> None:
        if self.value is None or (value > self.value if self.greater_is_better else value < self.value):
            self.value, self.step = value, step


@dataclass
class NanCount:
    """Optimizer steps skipped for a non-finite loss or gradient norm (train.nan_policy=skip)."""

    skipped_total: int = 0
    in_a_row: int = 0


@dataclass
class Patience:
    """Early stopping (train.early_stopping_patience): the metric's value that last counted as an improvement, and
    the validations since then that did not improve on it by more than train.early_stopping_delta."""

    value: float | None = None
    stale: int = 0

    def offer(self, value: float, greater_is_better: bool, delta: float) -> None:
        if self.value is None or (value - self.value if greater_is_better else self.value - value) > delta:
            self.value, self.stale = value, 0
        else:
            self.stale += 1


@dataclass
class TrainState:
    """Everything that changes as the run goes, exactly what a checkpoint's state.json holds, in its order.

    The position (step, epoch, batch_in_epoch) is the only thing that says where the run is: the data
    order of an epoch is a pure function of the seed and the epoch, so a resume starts there directly."""

    step: int  # optimizer steps done
    epoch: int
    batch_in_epoch: int  # micro-batches of this epoch already consumed (per rank)
    total_steps: int
    metrics: dict  # validation metrics of this step; {} when it was not evaluated
    best: Best
    nan: NanCount
    num_processes: int
    fingerprints: dict  # model, data and the train settings that shape the updates (setup.check_resumable)
    patience: Patience = field(default_factory=Patience)  # early stopping; absent from older checkpoints' state.json

    ADDED = ("patience",)  # may be missing from a state.json (written before it existed): its default then
    @classmethod
    def fresh(cls, metric: str, greater_is_better: bool, total_steps: int, num_processes: int,
              fingerprints: dict) -> TrainState:
        return cls(0, 0, 0, total_steps, {}, Best.of(metric, greater_is_better), NanCount(), num_processes, fingerprints)

    def to_json(self) -> dict:
        return {**asdict(self), "format": FORMAT}  # field order, nested ones too

    @classmethod
    def from_json(cls, obj, where: str) -> TrainState:
        """Strict: an older format, a missing, unknown or mistyped key is a ValueError naming `where` and the key."""
        check_format(obj, where)
        return _typed(cls, {k: v for k, v in obj.items() if k != "format"}, where, "")

    @classmethod
    def read(cls, path: Path) -> TrainState:
        return cls.from_json(read_json(path), str(path))

    def describe(self) -> str:
        return f"step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch} of that epoch)"


def check_format(state, where: str) -> None:
    """A state.json of the layout checkpoint.py writes; an older one (before save_state) is named as such."""
    if not isinstance(state, dict):
        raise ValueError(f"{where}: the state must be an object, got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise ValueError(f"{where} is in an older checkpoint format ({state.get('format', 'safetensors + JSON')}, "
                         f"before save_state); resume it with the version that wrote it, or start over with --restart")


_KIND = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
         type(None): "null"}


def _typed(cls, obj, where: str, prefix: str):
    """cls built from the JSON object `obj`, every field present and of its annotated type (int is not
    bool; a float field takes an integer); nested dataclasses in turn."""
    if not isinstance(obj, dict):
        what = f"key {prefix.rstrip('.')!r}" if prefix else "the state"
        raise ValueError(f"{where}: {what} must be an object, got {obj!r}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(obj) - set(hints))
    if unknown:
        raise ValueError(f"{where}: unknown key {prefix + unknown[0]!r}")
    values = {}
    added = getattr(cls, "ADDED", ())  # keys added since the format: an older state.json held their default
    for name, hint in hints.items():
        if name not in obj and name in added:  # a key added since: an older state held its default
            continue
        if name not in obj:
            raise ValueError(f"{where}: missing key {prefix + name!r}")
        if is_dataclass(hint):
            values[name] = _typed(hint, obj[name], where, f"{prefix}{name}.")
        else:
            values[name] = _checked(obj[name], hint, where, prefix + name)
    return cls(**values)


def _checked(value, hint, where: str, key: str):
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    ok = any(type(value) is k or (k is float and type(value) is int) for k in kinds)
    if not ok:
        want = " or ".join(_KIND[k] for k in kinds)
        raise ValueError(f"{where}: key {key!r} must be {want}, got {value!r}")
    return value


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


# ---------------------------------------------------------------- the scheduler (ours, not prepared)


def plain_state(state: dict, where: str) -> dict:
    """A scheduler state_dict checked to be plain JSON data (a LambdaLR with a plain function
    stores None for it; anything else would need pickling, which we refuse)."""
    try:
        return json.loads(json.dumps(state, allow_nan=True))
    except TypeError as e:
        raise ValueError(f"{where}: state is not plain data and cannot be checkpointed safely: {e}") from None


# ---------------------------------------------------------------- no code from a checkpoint

TORCH_PICKLES = (".bin", ".pt", ".pth", ".pkl")  # read by torch.load (accelerate, FSDP, DeepSpeed)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded folder: plain pickle.load
REFUSED = re.compile(r"custom_checkpoint_\d+\.pkl$")  # accelerate loads these with weights_only=False


_DCP_CLASSES = {"Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
                "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING"}
_OTHER_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                  ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                  ("collections", "OrderedDict")}


class _DcpMetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses, torch sizes, dtypes and layouts, and paths; nothing else."""

    def find_class(self, module: str, name: str):
        import torch

        # exact names only: a dotted name ("os.system") would reach through a module's imports
        allowed = ((module == "torch.distributed.checkpoint.metadata" and name in _DCP_CLASSES)
                   or (module, name) in _OTHER_GLOBALS
                   or (module == "torch" and name.isidentifier() and isinstance(getattr(torch, name, None), torch.dtype)))
        if not allowed:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def _weights_only(path: Path) -> None:
    import torch
    from accelerate.utils.other import TORCH_SAFE_GLOBALS  # the numpy types of accelerate's RNG file: data only

    # mmap: the unpickler reads the pickle stream (data.pkl), tensor bytes stay on disk unread; they
    # cannot run code. A legacy (non-zip) torch pickle cannot be mapped: refused, accelerate never writes one
    with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def check_no_code(folder: Path) -> None:
    """Read every pickle in `folder` (recursively) with a loader that cannot run code; ValueError naming
    the first file that needs more. Call before anything else reads the folder."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if REFUSED.match(path.name):
            raise ValueError(f"{folder}: {rel} is an accelerate custom-object pickle, which accelerate would load "
                             f"with weights_only=False (it may run code); this project never writes one: "
                             f"remove the file or use another checkpoint")
        try:
            if path.suffix in TORCH_PICKLES:
                _weights_only(path)
            elif path.name == DCP_METADATA:
                with path.open("rb") as f:
                    _DcpMetadataUnpickler(f).load()
        except Exception as e:  # noqa: BLE001 - whatever the reason, this file cannot be read safely
            raise ValueError(f"{folder}: {rel} cannot be read as data only ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]}); it may hold code: use another checkpoint") from None
