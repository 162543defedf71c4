"""The fixed mmap threshold: large blocks keep mappings of their own after a large block was freed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline import allocator

REPO = Path(__file__).resolve().parent.parent
glibc = pytest.mark.skipif(allocator._glibc() is None, reason="glibc's malloc only")

PROBE = textwrap.dedent("""
    import ctypes, sys
    from pipeline.allocator import keep_heap_flat
    said = keep_heap_flat() if sys.argv[1] == "fixed" else "default"
    libc = ctypes.CDLL(None)
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in names]
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(8 << 20))          # glibc's default raises its threshold to 8 MiB here
    before = libc.mallinfo2()
    block = libc.malloc(4 << 20)              # ... so this one comes from the heap, unless fixed
    after = libc.mallinfo2()
    print(said, "|", after.hblks - before.hblks, "|", after.hblkhd - before.hblkhd >= 4 << 20)
""")


def probe(mode: str, env: dict | None = None) -> list[str]:
    env = {**{k: v for k, v in os.environ.items() if k != allocator.ENV}, "PYTHONPATH": str(REPO), **(env or {})}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True)
    return [x.strip() for x in out.stdout.strip().split("|")]


@glibc
def test_default_glibc_serves_a_4mib_block_from_the_heap_after_an_8mib_one_was_freed():
    assert probe("default") == ["default", "0", "False"]  # the behaviour the fix exists for


@glibc
def test_fixed_threshold_keeps_the_block_in_a_mapping_of_its_own():
    assert probe("fixed") == ["mmap threshold fixed at 1 MiB", "1", "True"]


@glibc
def test_a_users_own_glibc_setting_wins():
    said, blocks, _ = probe("fixed", {allocator.ENV: str(16 << 20)})
    assert (said, blocks) == (f"{allocator.ENV}={16 << 20} (the user's)", "0")  # 4 MiB < their 16: the heap, not ours


@glibc
def test_processes_started_afterwards_inherit_the_threshold(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "placeholder")  # recorded, so the variable is removed again afterwards
    monkeypatch.delenv(allocator.ENV)
    libc = ctypes.CDLL(None)
    try:
        assert allocator.keep_heap_flat() == "mmap threshold fixed at 1 MiB"
        assert os.environ[allocator.ENV] == str(1 << 20)
    finally:  # this test process's own threshold stays fixed (harmless); its environment is restored
        libc.mallopt(allocator.M_MMAP_THRESHOLD, 128 << 10)
