"""The tiny evaluation world (tests/evalworld.py) for these tests."""

from tests.evalworld import make_world, untrained_model, world  # noqa: F401 - fixtures
