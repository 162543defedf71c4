"""No process a test starts outlives the test, whatever happened in it.

Every test runs with a token of its own in the environment (conftest.py), which every process it
starts inherits: launchers, the workers torchrun starts in sessions of their own, and workers that
lost their launcher and were re-parented. At the end of the test, every process still carrying the
token is killed. Reparenting and new sessions defeat a process-group or child-tree kill; an
inherited environment variable survives both.
"""

from __future__ import annotations

import os
import re

TOKEN_VAR = "PIPELINE_TEST_TOKEN"
# multiprocessing's forkserver and resource tracker serve this pytest process for the whole session
# (started by whichever test first needed them): killing them breaks every later test that forks
_SESSION_HELPERS = re.compile(r"from multiprocess(ing)?\.(forkserver|resource_tracker|semaphore_tracker) import main")


def carrying(token: str) -> list:
    """psutil processes (other than this one and its session helpers) started under `token`. A process between
    its fork and its exec shows no environment yet (/proc/PID/environ is empty until exec): those are looked at
    again once they had a moment to exec, so one started at the test's last moment is not missed."""
    import time

    import psutil

    found, pending = [], []
    for procs in (psutil.process_iter(), pending):
        for proc in list(procs):
            if proc.pid == os.getpid():
                continue
            try:
                env = proc.environ()
                if not env and procs is not pending and proc.ppid() > 2 and proc.status() != psutil.STATUS_ZOMBIE:
                    pending.append(proc)  # mid-exec (a user process; kernel threads have ppid 0 or 2)
                    continue
                if env.get(TOKEN_VAR) != token:
                    continue
                if proc.ppid() == os.getpid() and _SESSION_HELPERS.search(" ".join(proc.cmdline())):
                    continue
                found.append(proc)
            except (psutil.Error, OSError):  # exited meanwhile, a zombie, or not ours to read
                continue
        if pending and procs is not pending:
            time.sleep(0.05)
    return found


def reap(token: str) -> list[str]:
    """SIGKILL every process started under `token`; what was killed, as 'pid cmdline' lines."""
    import psutil

    procs, killed = carrying(token), []
    for proc in procs:
        try:
            killed.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
            proc.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=10)
    return killed
