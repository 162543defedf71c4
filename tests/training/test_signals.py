"""Stop requests: a signal only sets a flag (the loop saves and exits 75 at the next step boundary; the
real-process cases are in test_resume_kill.py, the in-process stop and resume in test_loop.py). That
`accelerate launch` runs train.py is checked by test_resume_kill.py's classifier matrix, whose uninterrupted
run it starts."""

from __future__ import annotations

import os
import signal

from pipeline.training import signals


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
