"""Stop requests (SIGTERM, SIGINT) and the exit codes of train.py.

A signal only sets a flag. The loop reads it after each optimizer step; with several processes
the flags are combined with one all-reduce (max), so every rank sees the same decision at the
same step, saves the same checkpoint and exits together: a signal delivered to one rank cannot
leave the others waiting in a collective. A second Ctrl-C falls back to Python's default and
interrupts at once.
"""

from __future__ import annotations

import signal
import sys

from pipeline.cli import EXIT_USAGE  # bad config or input, nothing was done
from pipeline.training.checkpoint import warn

EXIT_OK = 0  # finished (or nothing left to do)
EXIT_NONFINITE = 65  # halted on a non-finite loss or gradient norm; the message names the last healthy checkpoint
EXIT_INTERRUPTED = 75  # stopped by SIGTERM/SIGINT after saving a checkpoint: rerun with --resume auto

EXIT_CODES = {
    EXIT_OK: "training finished, or a resume found nothing left to do",
    EXIT_USAGE: "bad configuration or input; nothing was done",
    EXIT_NONFINITE: "halted on a non-finite loss or gradient norm (nan_policy)",
    EXIT_INTERRUPTED: "stopped by SIGTERM/SIGINT with a checkpoint saved; continue with --resume auto",
}


class StopFlag:
    """Installs SIGTERM/SIGINT handlers that record the request; `restore()` puts the old ones back."""

    def __init__(self) -> None:
        self.signal_name = ""
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        print(file=sys.stderr)  # off the progress bar's line
        warn(f"{self.signal_name} received: finishing this step, saving a checkpoint, then exiting "
             f"(exit code {EXIT_INTERRUPTED})")
        signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler)

    @property
    def requested(self) -> bool:
        return bool(self.signal_name)

    def saved(self) -> None:
        """The stop checkpoint is on disk. A further SIGTERM (torchrun passes the stop on to the ranks
        still shutting down) has nothing left to protect: ignore it so the exit stays clean (75)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def agree(acc, *flags: bool) -> list[bool]:
    """Combine per-process booleans over all ranks with one all-reduce (logical OR)."""
    import torch

    if acc.num_processes == 1:
        return [bool(f) for f in flags]
    t = torch.tensor([float(f) for f in flags], device=acc.device)
    return [bool(v) for v in acc.reduce(t, reduction="sum").tolist()]
