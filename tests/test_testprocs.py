"""The test suite's own guard: processes a test leaves behind are found and killed, even ones in a
session of their own whose parent has exited (as torchrun's workers are after a launcher dies)."""

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from tests.testprocs import TOKEN_VAR, reap

ORPHAN = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
os._exit(0)  # the parent goes; the sleeper is re-parented, in a session of its own
"""


@pytest.mark.slow
def test_an_orphan_in_its_own_session_is_reaped():
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_VAR: token}
    out = subprocess.run([sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True, timeout=60)
    orphan = psutil.Process(int(out.stdout.split()[0]))
    deadline = time.monotonic() + 30
    while "time.sleep(120)" not in " ".join(orphan.cmdline()) and time.monotonic() < deadline:
        time.sleep(0.01)  # its exec finished: Popen returns before, and until then /proc shows no environment
    assert orphan.is_running() and os.getsid(orphan.pid) != os.getsid(0)
    killed = reap(token)
    assert [int(line.split()[0]) for line in killed] == [orphan.pid]
    deadline = time.monotonic() + 10
    while orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
    assert reap(token) == []  # nothing else carried the token
