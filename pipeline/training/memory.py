"""A resident size that stays flat over a long run whose batch shapes vary.

glibc's malloc serves a block above its mmap threshold with a mapping of its own, returned to the
system when freed; but every time such a block is freed it raises the threshold to that block's size
(up to 32 MiB). After a few steps, the activations, gradients and attention scores of every new batch
shape come from the heap; freed, they leave holes that the next shape does not fit exactly, the heap
keeps their pages resident, and the resident size climbs step after step. Measured by
bench/bench_memory.py (train.py, lengths varying up to 512, 300 steps; bench/results/memory.md): the median
RSS grew +122 MiB and still rose with nothing released; +23 MiB with the free pages handed back every
10 steps (`malloc_trim`, 3% slower); +19 MiB every step (38% slower); +11 MiB with the mmap threshold
fixed at 1 MiB (48% slower: every step's activations faulted in afresh).

The training loop calls `release_free_heap` every `train.release_memory_every` steps: the
allocation fast path stays glibc's (pages are reused within those steps), only the holes between
them go back. A process whose malloc is not glibc's (musl, macOS, jemalloc or tcmalloc preloaded)
has nothing to release this way and is left alone.

Between those releases the loop also keeps what it frees (`hold_freed_memory`). With glibc's defaults
a block above the mmap threshold, which never rises past 32 MiB, gets a mapping of its own that its
free unmaps, and a free at the heap's top hands the top back: the next step faults the same pages in
again. MiniLM at max_length 64 (bench/results/train.md) took ~30,000 page faults a step, most of them its
47 MB word-embedding gradient, and spent 13% of its CPU time in the kernel. Every block from the heap
and no trim on free: 8-16% more tokens a second at max_length 64 and 4% at 256 (runs alternated), the
resident size still handed back every N steps.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)


@functools.cache
def _glibc():
    preload = os.environ.get("LD_PRELOAD", "")
    if sys.platform != "linux" or "jemalloc" in preload or "tcmalloc" in preload:
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        return libc
    except (OSError, AttributeError):
        return None


def hold_freed_memory() -> bool:
    """From now on, for the rest of the process: every block from glibc's heap (no mapping of its own) and
    no trim of the heap's top on a free below 2 GiB, so freed pages stay resident for the next blocks
    until release_free_heap (module docstring); True where set (glibc). glibc's mmap threshold stops
    adapting once it is set, and a later process-wide default cannot bring that back."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def release_free_heap() -> bool:
    """Hand the free pages of glibc's heaps back to the system; True if anything was released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
