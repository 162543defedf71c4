"""Stop requests: a signal only sets a flag (the loop saves and exits 75 at the next step boundary;
the real-process cases are in test_resume_kill.py), and `accelerate launch` runs train.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from pipeline.training import signals
from tests.training.trainkit import REPO, _env, run_dir


def test_signal_sets_the_flag_and_handlers_are_restored(capsys):
    before = signal.getsignal(signal.SIGTERM)
    flag = signals.StopFlag()
    assert not flag.requested
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.requested and flag.signal_name == "SIGTERM"
    assert capsys.readouterr().err == ("\nwarning: SIGTERM received: finishing this step, saving a checkpoint, then "
                                       "exiting (exit code 75)\n")  # through checkpoint.warn, off the bar's line
    flag.restore()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signals.EXIT_INTERRUPTED == 75 and set(signals.EXIT_CODES) == {0, 2, 65, 75}


@pytest.mark.slow
def test_accelerate_launch_runs_train_py(prepared):
    config = prepared(train={"epochs": 1, "save_every": 0})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_config.yaml"),
           str(REPO / "pipeline" / "train.py"), "--config", str(config)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 process(es), precision no" in out.stdout
    assert (run_dir(config) / "final" / "model.safetensors").is_file()
