"""Fixtures of the training tests (helpers live in trainkit.py, importable by name)."""

import pytest

from tests.accelkit import reset
from tests.training.trainkit import build_prepared


@pytest.fixture
def prepared(tmp_path):
    """Factory: prepared(kind="wordpiece", train={...}) -> config path of a ready-to-train toy run."""
    return lambda **kw: build_prepared(tmp_path, **kw)


@pytest.fixture
def fresh_accelerate():
    """accelerate's process-wide singletons reset before and after a test (accelkit.reset)."""
    reset()
    yield
    reset()

