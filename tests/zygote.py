"""Python scripts as real processes that skip the imports: forked from a warm zygote.

A train.py process spends ~6 s of CPU importing torch, transformers, accelerate, datasets and evaluate before
it reads its config, and its few dozen toy steps take ~1 s. The zygote is a process started once (per pytest
worker) that has imported those libraries and nothing else: no accelerator, no tensor op, no thread of ours.
Each launch forks it; the child runs the script as `python SCRIPT ARGS` would: as __main__ (runpy), with
sys.argv, sys.path[0] the script's folder, the launch's environment and working directory, stdin /dev/null and
stdout/stderr to files, and it ends through the interpreter's normal shutdown (atexit handlers, finalizers), so
its exit code is the script's. It is a real process: real signals, SIGKILL, exit codes, its own memory.
What differs from a fresh interpreter: the import work was done before the fork (the libraries' module state
is what import leaves, which train.py never relies on being otherwise: it quiets them explicitly, as the zygote
did before importing, pipeline.cli.quiet_libraries), and the children share one str-hash seed. In
test_resume_kill.py the classifier's uninterrupted run is a fresh process (`accelerate launch`), so the
equality there also holds between the two kinds of process. Where the launcher or a fresh interpreter is what
a test is about, it starts one (launch, run_train, tests/training/multikit.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env() -> dict:
    """A child's environment by default: this process's, one thread per process, no hub."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


ZYGOTE_PRELOAD = (
    "torch", "torch.utils.tensorboard", "accelerate", "accelerate.utils", "transformers", "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.models.bert.modeling_bert", "transformers.models.gpt2.modeling_gpt2", "datasets", "evaluate",
    "peft", "safetensors.torch", "sklearn.metrics", "tensorboard", "pipeline.train", "pipeline.training.loop",
    "pipeline.training.setup", "pipeline.training.validation", "pipeline.data.prepared", "pipeline.models.lora", "ftfy",
    "onnx", "torch.onnx", "pipeline.evaluate", "pipeline.evaluation.run", "pipeline.inference.predict",
    "pipeline.inference.onnx_export",
)  # not onnxruntime: importing it starts a thread, which a fork would not carry over


def serve() -> None:
    """The zygote's main (python -c, see Zygote): preload, then serve JSON-line requests on stdin/stdout."""
    import importlib
    import json as _json
    import signal as _signal
    import tempfile

    from pipeline.cli import quiet_libraries

    quiet_libraries(False)  # what train.py does before its first heavy import (no test launches with --verbose)
    noise = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # what importing prints, each child prints
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            for name in ZYGOTE_PRELOAD:
                importlib.import_module(name)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        for fd, f in ((1, out), (2, err)):
            f.seek(0)
            noise[fd] = f.read()
    # a fork carries only the forking thread: any other thread of ours would leave its locks held in the child.
    # pyarrow's jemalloc background thread is the one allowed: jemalloc's fork handlers restart it in the child.
    threads = [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]
    others = [t for t in threads if t != "jemalloc_bg_thd"]
    if len(others) != 1:
        raise RuntimeError(f"the zygote has threads after importing {ZYGOTE_PRELOAD}: {threads}")
    server, children = os.getpid(), {}  # pid -> exit code (None while it runs)

    def reap() -> None:
        for pid, rc in children.items():
            if rc is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid] = os.waitstatus_to_exitcode(status)

    def kill_all() -> None:
        for pid, rc in children.items():
            if rc is None:
                os.kill(pid, _signal.SIGKILL)
                children[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def reply(**obj) -> None:
        sys.stdout.write(_json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply(ready=True, pid=server)
    try:
        for line in sys.stdin:
            msg = _json.loads(line)
            reap()
            op = msg["op"]
            if op == "start":
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(msg, noise)  # never returns: the script's SystemExit ends the process
                children[pid] = None
                reply(pid=pid)
            elif op == "poll":
                reply(rc=children[msg["pid"]])
            elif op == "signal":
                if children[msg["pid"]] is None:  # not reaped yet: the pid is still this child's
                    os.kill(msg["pid"], msg["sig"])
                reply(ok=True)
            elif op == "kill_all":
                kill_all()
                children.clear()
                reply(ok=True)
    finally:
        if os.getpid() == server:  # stdin closed (the tests ended) or an error: no child outlives the zygote
            kill_all()


def _child(msg: dict, noise: dict) -> None:
    """In the forked child: become `python SCRIPT ARGS`, run the script, exit as it exits."""
    import ctypes
    import runpy
    import signal as _signal

    ctypes.CDLL(None).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG: the zygote's end is this child's
    if os.getppid() == 1:
        os._exit(137)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(msg["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = out if msg["stderr"] == msg["stdout"] else os.open(msg["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {null, out, err}:
        os.close(fd)
    for fd, text in noise.items():
        os.write(fd, text)
    os.environ.clear()
    os.environ.update(msg["env"])
    os.chdir(msg["cwd"])
    script = str(Path(msg["argv"][0]).resolve())
    sys.argv = [script, *msg["argv"][1:]]
    sys.path[0] = str(Path(script).parent)  # as `python SCRIPT` puts it (train.py's _entrypoint replaces it)
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)  # a script that returns without sys.exit


class Zygote:
    """The test side of the zygote: start (fork) a script, poll, signal; thread-safe."""

    def __init__(self):
        import threading

        from tests.testprocs import TOKEN_VAR

        code = "from tests.zygote import serve; serve()"
        # the environment the session started with (not a test's monkeypatched one): what the imports read
        env = {**{k: v for k, v in _SESSION_ENV.items() if k != TOKEN_VAR}, "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd=REPO, text=True)
        self.lock = threading.Lock()
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError(f"the zygote did not start (exit {self.proc.wait()})")

    def request(self, **msg) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote ended (exit {self.proc.wait()})")
        return json.loads(answer)

    def start(self, argv: list[str], stdout: Path, stderr: Path, env: dict | None = None) -> Forked:
        pid = self.request(op="start", argv=[str(a) for a in argv], stdout=str(stdout), stderr=str(stderr),
                           env=env if env is not None else child_env(), cwd=str(REPO))["pid"]
        return Forked(self, pid, argv)

    def kill_all(self) -> None:
        if self.proc.poll() is None:
            self.request(op="kill_all")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


class Forked:
    """A child of the zygote, with subprocess.Popen's pid, poll, wait, send_signal, kill and returncode (negative:
    the signal that ended it)."""

    def __init__(self, zygote: Zygote, pid: int, args: list):
        self.zygote, self.pid, self.args, self.returncode = zygote, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.request(op="poll", pid=self.pid)["rc"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self.zygote.request(op="signal", pid=self.pid, sig=int(sig))

    def kill(self) -> None:
        import signal as _signal

        self.send_signal(_signal.SIGKILL)

    def terminate(self) -> None:
        import signal as _signal

        self.send_signal(_signal.SIGTERM)


_ZYGOTE: list = []
_SESSION_ENV = dict(os.environ)  # when the test session imports this module, before any test changes it


def zygote() -> Zygote:
    """This pytest process's zygote, started on first use (one import's cost) and ended with the process."""
    if not _ZYGOTE or _ZYGOTE[0].proc.poll() is not None:
        import atexit

        _ZYGOTE[:] = [Zygote()]
        atexit.register(_ZYGOTE[0].close)
    return _ZYGOTE[0]


def end_forked() -> None:
    """SIGKILL every zygote child still running (the test that started them has ended)."""
    if _ZYGOTE:
        _ZYGOTE[0].kill_all()


def fork_run(argv: list, timeout: int = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) of `python SCRIPT ARGS`, forked from the zygote (argv[0]: the
    script, run as __main__ from the repository root)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = zygote().start([str(a) for a in argv], out, err, env or child_env())
        try:
            rc = proc.wait(timeout)
        finally:
            proc.kill()
        return subprocess.CompletedProcess(proc.args, rc, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def fork_ranks(argv: list, processes: int, log: Path, env: dict | None = None) -> list[Forked]:
    """`torchrun --nproc_per_node PROCESSES SCRIPT ARGS` without the launcher: `processes` ranks of the script
    forked from the zygote, each with the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/PORT on a free port, ...; rank 0 hosts the rendezvous store) on top of `env` (default: this
    process's, one thread per process). Rank r's output goes to <log>-<r>.log."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    common = {**(env if env is not None else child_env()), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(port), "WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
              "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(processes),
              "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}
    ranks = []
    for r in range(processes):
        out = log.with_name(f"{log.name}-{r}.log")
        rank_env = {**common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)}
        ranks.append(zygote().start([str(a) for a in argv], out, out, rank_env))
    return ranks


def wait_ranks(ranks: list, timeout: float = 300, end=None) -> list[int | None]:
    """Exit codes of processes (forked ranks, or any Popen); None for one still running after `timeout` s. Then
    every one is ended with `end` (default: SIGKILL): a rank whose peer died waits in a collective."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in ranks:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in ranks:
        (end or type(p).kill)(p)
    return codes
