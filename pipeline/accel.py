"""Building an Accelerator that behaves the same under every launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags of CPUs that compute bf16 natively: x86 AVX512-BF16 and AMX, Arm's BF16 extension
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# "1"/"0": take the CPU as one with/without native bf16 whatever its flags say (the test suite pins "0", so that
# `auto` precision decides alike on every CI machine; its subprocesses inherit it)
NATIVE_BF16_VAR = "PIPELINE_NATIVE_BF16"
# train.mixed_precision and eval.precision: bf16 where the device computes it natively (native_bf16), fp32 elsewhere
AUTO = "auto"


CPUINFO = Path("/proc/cpuinfo")
# the flags a benchmark records of its CPU: vector width, native bf16, int8 dot products (VNNI, AMX)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "amx_int8")


def _cpuinfo() -> str:
    try:
        return CPUINFO.read_text(errors="ignore")
    except OSError:
        return ""


def _flags_of(text: str) -> set[str]:
    lines = (line.split(":", 1) for line in text.splitlines() if line.startswith(("flags", "Features")))
    return {flag for _, value in lines for flag in value.split()}


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, Arm `Features`); empty where it cannot be read."""
    return _flags_of(_cpuinfo())


def _forced_bf16() -> str:
    """$PIPELINE_NATIVE_BF16: "1", "0", or "" where unset (then the flags answer)."""
    forced = os.environ.get(NATIVE_BF16_VAR, "").strip()
    if forced not in ("", "0", "1"):
        raise ValueError(f"${NATIVE_BF16_VAR}={forced!r}: set it to 1 or 0, or unset it to read the CPU's flags")
    return forced


def cpu_has_native_bf16() -> bool:
    """True where the CPU computes bf16 natively; elsewhere torch emulates bf16 (15-20x slower than fp32).
    $PIPELINE_NATIVE_BF16 (1 or 0), where set, answers instead of the flags."""
    forced = _forced_bf16()
    return forced == "1" if forced else bool(NATIVE_BF16_FLAGS & cpu_flags())


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu", "cuda", ...) computes bf16 natively: the CPU's flags, a CUDA GPU's
    capability (Ampere and later); False for any other device."""
    if device_type == "cpu":
        return cpu_has_native_bf16()
    if device_type == "cuda":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return False


def device_type() -> str:
    """The device an Accelerator built now trains on: "cuda" where a CUDA GPU is visible and accelerate's use_cpu
    ($ACCELERATE_USE_CPU, set by `accelerate launch` from its config) is off, else "cpu"."""
    import torch
    from accelerate.utils import parse_flag_from_env

    return "cuda" if torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU") else "cpu"


def why_precision(device_type: str) -> str:
    """Why `auto` chose what it did on `device_type`, for the line a run prints and records."""
    if device_type == "cpu":
        forced = _forced_bf16()
        if forced:
            return f"${NATIVE_BF16_VAR}={forced}"
        native = sorted(NATIVE_BF16_FLAGS & cpu_flags())
        return f"CPU flags {' '.join(native)}" if native else "this CPU has no native bf16 (no avx512_bf16/amx_bf16)"
    return f"{device_type} {'computes' if native_bf16(device_type) else 'has no native'} bf16"


def describe_cpu() -> str:
    """What every benchmark records of its machine: '<model name>, N cores, CPU flags avx2 avx512f ...'."""
    import platform

    text = _cpuinfo()
    have = _flags_of(text)
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())
    flags = " ".join(f for f in SPEED_FLAGS if f in have) or "none of " + "/".join(SPEED_FLAGS)
    return f"{name}, {os.cpu_count()} cores, CPU flags {flags}"


def launched_on_cpu() -> bool:
    """Several processes started by a launcher on a machine without an accelerator.

    accelerate's torchrun launcher does not pass a config's `use_cpu` on: without `cpu=True` such
    processes would each run alone (DistributedType.NO) instead of as one gloo group (MULTI_CPU).
    """
    import torch

    device = getattr(torch, "accelerator", torch.cuda)
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not device.is_available()


def make_accelerator(**kwargs: Any):
    from accelerate import Accelerator

    return Accelerator(cpu=kwargs.pop("cpu", False) or launched_on_cpu(), **kwargs)
