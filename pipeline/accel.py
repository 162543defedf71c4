"""Building an Accelerator that behaves the same under every launcher."""

from __future__ import annotations

import os
from typing import Any


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
