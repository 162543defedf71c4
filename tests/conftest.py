"""Fixtures for every test."""

import sys
import uuid

import pytest
from testprocs import TOKEN_VAR, reap


@pytest.fixture(autouse=True)
def _end_started_processes(monkeypatch):
    """Whatever a test started is killed when it ends (a failed launch once left a launcher running)."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    yield
    left = reap(token)
    if left:
        print(f"killed {len(left)} process(es) the test left running:\n  " + "\n  ".join(left), file=sys.stderr)
