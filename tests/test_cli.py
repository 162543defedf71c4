"""pipeline/cli.py: what every entry script does on its way out."""

import pytest

from pipeline.cli import end_process_group, run_main


def test_the_process_group_is_destroyed_however_main_ends(tmp_path):
    import torch.distributed as dist

    def main_that_fails(argv):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        raise ValueError("bad setting")

    with pytest.raises(SystemExit) as ended:
        run_main(main_that_fails)
    assert ended.value.code == 2 and not dist.is_initialized()
    end_process_group()  # nothing joined: nothing to do, no error


def test_ctrl_c_is_one_line_exit_130_even_where_a_library_swallowed_it(monkeypatch, capfd):
    """run_main's side of Ctrl-C, in this process: a KeyboardInterrupt, a Ctrl-C that a library swallowed (main
    returned, or raised another error while it unwound) all end as one line and 130. With real signals and a real
    prepare.py: test_hostile_prepare.py's test_ctrl_c_is_one_line_exit_130_and_leaves_no_temporary and
    test_a_ctrl_c_that_a_library_swallows_still_stops_the_run_before_the_stage_is_complete."""
    import signal

    from pipeline import cli

    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # this process's own SIGINT handler stays as it is

    def interrupted(argv):
        raise KeyboardInterrupt

    def closed_writer(argv):
        raise ValueError("the writer was closed")

    for main, seen in ((interrupted, False), (lambda argv: 0, True), (closed_writer, True)):
        monkeypatch.setattr(cli, "_ctrl_c_seen", seen)  # seen: the Ctrl-C came and a library swallowed it
        capfd.readouterr()
        with pytest.raises(SystemExit) as ended:
            run_main(main)
        assert (ended.value.code, capfd.readouterr().err) == (130, "error: interrupted (Ctrl-C)\n")
    monkeypatch.setattr(cli, "_ctrl_c_seen", False)
    with pytest.raises(SystemExit) as ended:
        run_main(closed_writer)
    assert (ended.value.code, capfd.readouterr().err) == (2, "error: the writer was closed\n")


def test_a_library_thread_that_dies_is_one_warning_line_not_a_traceback(monkeypatch, capfd):
    """TensorBoard's event writer on a read-only folder: the run's one-line error, then a 13-line traceback from
    the writer's thread. run_main installs the hook; PIPELINE_DEBUG=1 keeps the traceback."""
    import threading

    from pipeline import cli

    monkeypatch.setattr(threading, "excepthook", cli._thread_failed)

    def fail():
        raise OSError(30, "Read-only file system", b"/run/tensorboard/events.out")

    t = threading.Thread(target=fail, name="writer")
    t.start()
    t.join()
    assert capfd.readouterr().err == ("warning: background thread writer stopped: OSError: /run/tensorboard/events.out: "
                                      "Read-only file system\n")
    monkeypatch.setenv("PIPELINE_DEBUG", "1")
    t = threading.Thread(target=fail, name="writer")
    t.start()
    t.join()
    assert "Traceback (most recent call last)" in capfd.readouterr().err
