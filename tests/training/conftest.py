"""Fixtures of the training tests (helpers live in trainkit.py, importable by name)."""

import pytest
from trainkit import build_prepared


@pytest.fixture
def prepared(tmp_path):
    """Factory: prepared(kind="wordpiece", train={...}) -> config path of a ready-to-train toy run."""
    return lambda **kw: build_prepared(tmp_path, **kw)


@pytest.fixture
def fresh_accelerate():
    """accelerate keeps process-wide singletons; reset them so in-process runs do not leak settings."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
