"""The filter between prepare's Ray driver (a child process) and the terminal: no Ray needed."""

import io

import pytest

from pipeline.data.engines.ray.driver import StderrFilter

RAY_LINE = b"[2026-12-02 07:43:53,121 E 16622 16864] core_worker_process.cc:1029: Failed to get the system config from raylet because it is dead.\n"


def _through(*chunks: bytes) -> tuple[bytes, StderrFilter]:
    out = io.BytesIO()
    relay = StderrFilter(out)
    for chunk in chunks:
        relay.feed(chunk)
    relay.close()
    return out.getvalue(), relay


@pytest.mark.parametrize("cut", [1, 7, 40, len(RAY_LINE) - 1, len(RAY_LINE)])
def test_rays_log_lines_are_held_back_wherever_the_pipe_cuts_them(cut):
    text = b"load:  10%\rload:  50%\r" + RAY_LINE + b"[not a ray line]\nerror: clean failed\n"
    out, relay = _through(text[:len(b"load:  10%\rload:  50%\r") + cut], text[len(b"load:  10%\rload:  50%\r") + cut:])
    assert out == b"load:  10%\rload:  50%\r[not a ray line]\nerror: clean failed\n"
    assert relay.held_back == 1 and relay.saw_error
    assert relay.last_ray_line == ("core_worker_process.cc:1029: Failed to get the system config from raylet "
                                   "because it is dead.")


def test_a_progress_bar_passes_at_once_and_the_first_ray_warning_is_the_cause():
    out = io.BytesIO()
    relay = StderrFilter(out)
    relay.feed(b"tokenize:  3%")  # no newline yet: a bar must not wait for one
    assert out.getvalue() == b"tokenize:  3%"
    relay.feed(b"\rtokenize: 9%\nwarning: ray (raylet): Raylet is terminated.\nwarning: ray (raylet): The node died.\n")
    assert relay.ray_warning == "Raylet is terminated." and not relay.saw_error


def test_an_unfinished_line_is_written_at_the_end():
    out, relay = _through(b"[2026-12-02 07:43:53,121 E 1 2] no newline")
    assert out == b"[2026-12-02 07:43:53,121 E 1 2] no newline" and relay.held_back == 0
