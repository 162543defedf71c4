"""prepare on Ray runs its Ray driver in a child process, which the prepare command watches.

Ray's core worker ends the driver process by itself when the raylet or the GCS it talks to dies (a
C++ exit with status 1: no Python exception, no `finally`, no message of ours), and writes its C++
log lines (`[2026-... E 123 456] core_worker.cc:...`) on the driver's stderr. So the command is two
processes: this module's `supervise` (no Ray, no data) starts the same prepare as a child, passes
its output through without Ray's C++ log lines (they stay in Ray's session logs), forwards Ctrl-C
and SIGTERM to it, and when the child ends without an `error:` line of its own says in one line
what ended it. Nothing is marked complete by a stage that did not finish, so a rerun continues.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import BinaryIO

from pipeline import REPO_ROOT
from pipeline.data.engines.base import StageFailed

CHILD_ENV = "PIPELINE_RAY_DRIVER"  # set in the child: it runs the stages instead of starting another child
RAY_LOG_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] ")  # Ray's C++ (glog-style) lines
RAY_LOGS = "/tmp/ray/session_latest/logs"  # where a driver started on this machine keeps its logs
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def is_driver() -> bool:
    """True in the child that runs the stages on Ray."""
    return os.environ.get(CHILD_ENV) == "1"


class StderrFilter:
    """Passes the child's stderr through, byte for byte (progress bars' `\\r` updates included), except
    whole lines in Ray's C++ log format; remembers the last of those, the first of Ray's system messages
    and whether an `error:` line passed."""

    def __init__(self, out: BinaryIO):
        self.out, self.pending, self.passing = out, b"", False  # passing: inside a line already let through
        self.saw_error, self.last_ray_line, self.held_back = False, "", 0
        self.ray_warning = ""  # the first of Ray's system messages (engine.one_line_system_messages): the cause

    def feed(self, chunk: bytes) -> None:
        data, sent = self.pending + chunk, []
        self.pending = b""
        while data:
            if self.passing:  # the rest of a line already judged: up to its newline, or a bar's \r
                end = min((i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0), default=-1)
                piece, data = (data, b"") if end < 0 else (data[:end + 1], data[end + 1:])
                sent.append(piece)
                self.passing = end < 0
                continue
            if data[:1] != b"[":  # cannot be a Ray log line: judge the line now, send what is here
                self.saw_error |= data.startswith(b"error: ")
                if data.startswith(b"warning: ray (") and not self.ray_warning and b"\n" in data:
                    self.ray_warning = data[:data.find(b"\n")].split(b"): ", 1)[-1].decode("utf-8", "replace")
                self.passing = True
                continue
            end = data.find(b"\n")
            if end < 0:  # a line that may be Ray's: wait for its end (Ray writes its lines whole)
                self.pending = data
                break
            line, data = data[:end + 1], data[end + 1:]
            if RAY_LOG_LINE.match(line):
                self.held_back += 1
                self.last_ray_line = RAY_LOG_LINE.sub(b"", line).decode("utf-8", "replace").strip()
            else:
                sent.append(line)
        if sent:
            self.out.write(b"".join(sent))
            self.out.flush()

    def close(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.out.flush()
            self.pending = b""


def supervise(argv: list[str]) -> int:
    """Run `prepare.py argv` as a child that drives Ray; its exit code, or one line when it ended
    without saying why (Ray ended it, or a signal killed it)."""
    env = {**os.environ, CHILD_ENV: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    child = subprocess.Popen([sys.executable, str(REPO_ROOT / "pipeline" / "prepare.py"), *argv], env=env, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=_die_with_parent)  # Ctrl-C reaches it once: from us
    before = {s: signal.signal(s, lambda signum, frame: _forward(child, signum)) for s in FORWARDED}
    relay = StderrFilter(sys.stderr.buffer)
    try:
        sys.stderr.flush()
        while chunk := _read(child.stderr.fileno()):
            relay.feed(chunk)
        relay.close()
        code = child.wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if code == 0 or relay.saw_error:
        return code
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    said = (f"; Ray: {relay.ray_warning}" if relay.ray_warning else
            f"; Ray's last log line: {relay.last_ray_line[:240]}" if relay.last_ray_line else "")
    raise StageFailed(f"prepare's Ray driver ended without finishing ({how}{said}); the stage it was running was "
                      f"not saved: run prepare again (finished stages are reused). Ray's logs: {RAY_LOGS}")


def _read(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 1 << 16)
        except InterruptedError:  # a forwarded signal arrived during the read
            continue


def _forward(child: subprocess.Popen, signum: int) -> None:
    if child.poll() is None:
        os.kill(child.pid, signum)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the watching prepare dies (killed, it cannot forward)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):  # not Linux: the child then outlives a killed parent, as before
        pass
