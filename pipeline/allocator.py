"""A resident size that stays flat over a long run whose batch shapes vary.

glibc's malloc serves a block above its mmap threshold with a mapping of its own, returned to the
system when freed; but every time such a block is freed it raises the threshold to that block's size
(up to 32 MiB). After a few steps, activations, gradients and attention scores of every new batch
shape come from the heap instead; freed, they leave holes that the next shape does not fit, and the
resident size climbs step after step. Measured with bench/bench_memory.py (varying lengths up to
512): 612 -> 1280 MiB in 300 steps and still rising with glibc's default, 461 -> 586 MiB, flat
after ~100 steps, with the threshold fixed. Fixing it (`mallopt(M_MMAP_THRESHOLD)`, or glibc's own
`MALLOC_MMAP_THRESHOLD_` variable, which does the same) turns the dynamic raise off.

A user's own `MALLOC_MMAP_THRESHOLD_` wins, `PIPELINE_MALLOC=default` keeps glibc's dynamic threshold
(to compare), and a process whose malloc is not glibc's (musl, macOS, jemalloc or tcmalloc preloaded)
is left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
THRESHOLD = 1 << 20  # blocks of 1 MiB and up get mappings of their own: every activation of a real batch
ENV = "MALLOC_MMAP_THRESHOLD_"


def _glibc():
    if sys.platform != "linux" or "jemalloc" in os.environ.get("LD_PRELOAD", "") or "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        return libc
    except (OSError, AttributeError):
        return None


def keep_heap_flat() -> str:
    """Fix glibc's mmap threshold for this process (and the workers it forks); say what was done."""
    if ENV in os.environ:
        return f"{ENV}={os.environ[ENV]} (the user's)"
    if os.environ.get("PIPELINE_MALLOC") == "default":
        return "PIPELINE_MALLOC=default: glibc's dynamic threshold kept"
    libc = _glibc()
    if libc is None:
        return "not glibc: left alone"
    if libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD) != 1:
        return "mallopt refused: left alone"
    os.environ[ENV] = str(THRESHOLD)  # processes started from here (spawned workers, torchrun ranks) get it too
    return f"mmap threshold fixed at {THRESHOLD >> 20} MiB"
