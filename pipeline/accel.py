"""Building an Accelerator that behaves the same under every launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags of CPUs that compute bf16 natively: x86 AVX512-BF16 and AMX, Arm's BF16 extension
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16() -> bool:
    """True where the CPU computes bf16 natively; elsewhere torch emulates bf16 (15-20x slower than fp32)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return False
    return bool(NATIVE_BF16_FLAGS & set(text.split()))


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
