"""release_free_heap: the pages of freed heap blocks go back to the system; without it they stay."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.training import memory

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import ctypes, os, sys
    from pipeline.training.memory import release_free_heap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    blocks = [libc.malloc(100_000) for _ in range(2000)]   # 200 MB in heap-sized blocks (below 128 KiB)
    for b in blocks:
        ctypes.memset(b, 1, 100_000)                        # resident
    for b in blocks[:-1]:
        libc.free(b)                                       # freed, but the last block pins the heap's top
    before = rss_mib()
    released = release_free_heap() if sys.argv[1] == "release" else False
    print(released, round(before - rss_mib()))
""")


def probe(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    released, drop = out.stdout.split()
    return released, int(drop)


@pytest.mark.slow
@pytest.mark.skipif(memory._glibc() is None, reason="glibc's malloc only")
def test_freed_heap_pages_stay_resident_until_released():
    released, drop = probe("keep")
    assert (released, drop) == ("False", 0)  # what grows a long run: the holes stay resident
    released, drop = probe("release")
    assert released == "True" and drop > 150  # ~190 MiB of the 200 MB freed come back


def test_release_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.release_free_heap() is False


HOLD_PROBE = textwrap.dedent("""
    import ctypes, resource, sys
    from pipeline.training.memory import hold_freed_memory, release_free_heap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    held = hold_freed_memory() if sys.argv[1] == "hold" else False
    size = 48 * 2**20                                      # a MiniLM word-embedding gradient: above glibc's 32 MiB mmap ceiling
    def faults_of_a_step():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    faults_of_a_step()                                     # the first step faults its pages in, held or not
    steps = [faults_of_a_step() for _ in range(3)]
    release_free_heap()
    print(held, max(steps), faults_of_a_step())
""")


@pytest.mark.slow
@pytest.mark.skipif(memory._glibc() is None, reason="glibc's malloc only")
def test_held_memory_is_not_faulted_in_again_each_step_until_released():
    def run(mode: str) -> tuple[str, int, int]:
        out = subprocess.run([sys.executable, "-c", HOLD_PROBE, mode], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
        held, steps, after_release = out.stdout.split()
        return held, int(steps), int(after_release)

    pages = 48 * 2**20 // 4096
    held, steps, after_release = run("glibc")
    assert held == "False" and steps > pages // 2  # its own mapping each time: every page faulted in again
    held, steps, after_release = run("hold")
    assert held == "True" and steps < 100  # the freed block's pages are the next one's
    assert after_release > pages // 2  # release_free_heap handed them back


def test_hold_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.hold_freed_memory() is False
