"""What the prepare tests share: a manifest less its per-run values (the equal-output tests: two processes, two
engines), prepare's entry point run in this process, and a prepared folder copied instead of prepared again."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
from pathlib import Path


def stable(obj, volatile: set):
    """`obj` (a manifest, or part of one) without the keys in `volatile`, at any depth."""
    if isinstance(obj, dict):
        return {k: stable(v, volatile) for k, v in obj.items() if k not in volatile}
    if isinstance(obj, list):
        return [stable(v, volatile) for v in obj]
    return obj


@contextlib.contextmanager
def _library_settings_kept():
    """What run_main and quiet_libraries change in a process (the SIGINT handler, datasets' and transformers'
    progress bars and verbosity, two loggers' levels), put back afterwards: this process goes on to other tests."""
    import datasets

    loggers = [logging.getLogger(name) for name in ("accelerate.utils.other", "mlflow.store.db.utils")]
    levels = [lg.level for lg in loggers]
    sigint, bars = signal.getsignal(signal.SIGINT), datasets.is_progress_bar_enabled()
    hf = sys.modules.get("transformers")
    verbosity = hf.utils.logging.get_verbosity() if hf else None
    hf_bars = hf.utils.logging.is_progress_bar_enabled() if hf else None
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, sigint)
        datasets.enable_progress_bars() if bars else datasets.disable_progress_bars()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if hf is not None:
            hf.utils.logging.set_verbosity(verbosity)
            hf.utils.logging.enable_progress_bar() if hf_bars else hf.utils.logging.disable_progress_bar()


def prepare_here(monkeypatch, capfd, *args: str) -> tuple[int, str]:
    """`python pipeline/prepare.py *args` as its entry script runs it (cli.run_main: the `error:` line, the exit
    code), but in this process: (exit code, stderr). For what does not depend on a process of its own; what
    does (a signal, a kill, what the interpreter prints on its way out, an import never made) keeps real ones."""
    import pytest

    from pipeline import cli, prepare

    monkeypatch.setattr(sys, "argv", ["pipeline/prepare.py", *args])
    for var, value in (("HF_HUB_DISABLE_TELEMETRY", "1"), ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error")):
        monkeypatch.setenv(var, value)  # what run_main and quiet_libraries set where the user did not
    monkeypatch.delenv("PIPELINE_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_ctrl_c_seen", False)
    capfd.readouterr()
    with _library_settings_kept(), pytest.raises(SystemExit) as ended:
        cli.run_main(prepare.main)
    return ended.value.code, capfd.readouterr().err


def copy_prepared(source_out: Path, cfg) -> list[dict]:
    """The output_dir of a finished prepare copied to `cfg`'s, and `cfg` (the same settings and source, that
    output_dir) prepared there: every stage is reused (a stage's key holds its settings and its input, not where
    output_dir is) and prepared.json now points at the copy. The report rows. A prepare there with other settings
    leaves the copied stages beside its own: find a stage's folder by its key, not by its name alone."""
    from pipeline import tasks
    from pipeline.data import runner

    shutil.copytree(source_out, cfg.output_dir, symlinks=True)
    rows = runner.run(cfg, tasks.get(cfg.task), progress=False)
    assert all(r["cached"] for r in rows), rows
    return rows
