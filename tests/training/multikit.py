"""Helpers of the multi-process tests: launch train.py through `accelerate launch` as 2 gloo processes
on one machine, or as two "machines" on localhost (two launchers, machine ranks 0 and 1), find the
worker processes a launcher started, and read back what the workers exited with; and train_here, the
one-process run these tests compare with, in the test's own process (no interpreter start, no imports)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from tests.training.trainkit import REPO, records
from tests.zygote import wait_ranks

CONFIGS = REPO / "configs" / "accelerate"


def env() -> dict:
    # ACCELERATE_USE_CPU: the torchrun launcher does not pass the configs' `use_cpu` on (see
    # configs/accelerate/cpu_multiprocess.yaml); one thread per process on a 2-core machine
    return {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate(config_file: str, config: Path, extra: tuple, log: Path, launcher_args: tuple = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config_file),
           *launcher_args, str(REPO / "pipeline" / "train.py"), "--config", str(config), *extra]
    out = open(log, "w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(), cwd=REPO, start_new_session=True)


def launch_two_processes(config: Path, *extra: str, log: str = "multi") -> subprocess.Popen:
    """`accelerate launch --config_file configs/accelerate/cpu_multiprocess.yaml pipeline/train.py ...`"""
    return _accelerate("cpu_multiprocess.yaml", config, extra, config.parent / f"{log}.log")


def launch_two_machines(config: Path, *extra: str, log: str = "machine") -> list[subprocess.Popen]:
    """Two launchers, as on two machines: the cpu_two_machines_rank{0,1}.yaml pair on a free port."""
    port = str(free_port())
    return [_accelerate(f"cpu_two_machines_rank{r}.yaml", config, extra, config.parent / f"{log}{r}.log",
                        ("--main_process_port", port)) for r in (0, 1)]


def log_of(config: Path, name: str) -> str:
    return (config.parent / f"{name}.log").read_text(errors="replace")


def workers(launcher: subprocess.Popen, count: int, timeout: float = 120) -> dict[int, int]:
    """{global rank: pid} of the train.py processes a launcher started (read from their RANK variable)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                rank = child.environ().get("RANK")
                if rank is not None and any("train.py" in part for part in child.cmdline()):
                    found[int(rank)] = child.pid
            except psutil.Error:  # exited meanwhile
                continue
        if len(found) == count:
            return found
        assert launcher.poll() is None, f"launcher exited with {launcher.returncode} before starting its workers"
        time.sleep(0.1)
    raise TimeoutError(f"{count} workers did not start within {timeout}s")


def wait_for_step(launchers: list[subprocess.Popen], run: Path, step: int, timeout: float = 180) -> None:
    """Poll metrics.jsonl until training logs `step`; fail if a launcher ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in records(run)):
            return
        ended = [p.returncode for p in launchers if p.poll() is not None]
        assert not ended, f"a launcher exited ({ended}) before step {step}"
        time.sleep(0.02)
    raise TimeoutError(f"no step {step} within {timeout}s")


def wait_all(launchers: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """Exit codes of the launchers; None for one still running after `timeout` s (then it and its workers are killed)."""
    return wait_ranks(launchers, timeout, end=stop)


def stop(launcher: subprocess.Popen) -> None:
    """Kill a launcher and everything it started, if still running. torchrun starts each worker in a
    session of its own, so killing the launcher's process group would leave them behind."""
    import psutil

    if launcher.poll() is not None:
        return
    try:
        family = psutil.Process(launcher.pid).children(recursive=True)
    except psutil.Error:
        family = []
    for p in family:
        try:
            p.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        except psutil.Error:
            pass
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait(timeout=30)


def worker_exit_codes(log_text: str) -> dict[int, int]:
    """{rank: exit code} from torchrun's failure report (it lists only the workers that failed)."""
    codes = {}
    for block in re.findall(r"^\s+rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", log_text, flags=re.S | re.M):
        codes.setdefault(int(block[0]), int(block[1]))
    return codes


def train_here(config: Path, *overrides: str, resume: str | None = None, log: str = "proc") -> int:
    """What `python pipeline/train.py --config CONFIG [--resume R] OVERRIDES` does, in this process: the same
    training loop on the same config (one process: nothing in it depends on being a process of its own), with
    accelerate's singletons reset before and after. Its output goes to <config folder>/<log>.log, as launch's
    does (trainkit.log_text reads it); returns the exit code train.py would."""
    from pipeline.checks import load_config
    from pipeline.training.loop import train
    from tests.accelkit import reset

    reset()
    try:
        with open(config.parent / f"{log}.log", "w") as out, redirect_stdout(out), redirect_stderr(out):
            return train(load_config(config, list(overrides)), str(config), resume)
    finally:
        reset()
