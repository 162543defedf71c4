"""Building an Accelerator that behaves the same under every launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags of CPUs that compute bf16 natively: x86 AVX512-BF16 and AMX, Arm's BF16 extension
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


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


def cpu_has_native_bf16() -> bool:
    """True where the CPU computes bf16 natively; elsewhere torch emulates bf16 (15-20x slower than fp32)."""
    return bool(NATIVE_BF16_FLAGS & cpu_flags())


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
