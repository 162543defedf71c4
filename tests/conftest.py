"""Fixtures for every test."""

import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.accel import NATIVE_BF16_VAR
from tests.smollm2 import GGUF_NAME, SPEC
from tests.testprocs import TOKEN_VAR, reap
from tests.zygote import end_forked

# The suite runs as on a CPU without native bf16, whatever this one has: `auto` precision then trains and
# validates in fp32 here as on every CI machine, so exact values and tolerances hold on both kinds. Subprocesses
# inherit it; the tests of `auto` itself set the detector in-process (tests/training/test_auto_precision.py).
os.environ[NATIVE_BF16_VAR] = "0"
# One thread per process, as every process the tests start has: the workers of pytest -n share the cores, and
# in-process and subprocess runs of the same training do the same arithmetic.
os.environ["OMP_NUM_THREADS"] = "1"


SESSION_GROUPS = {"ray_cluster": "ray", "converted": "smollm2"}  # session fixtures that start something costly


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups and the -m filter reads the marks
def pytest_collection_modifyitems(items):
    """pytest-xdist's groups (--dist loadgroup): a test file runs whole on one worker, so its module fixtures run
    once; the tests that use the session's Ray or the converted SmolLM2 run on one worker, so each starts once,
    and they are slow (a cluster; a 540 MB conversion)."""
    for item in items:
        shared = [group for name, group in SESSION_GROUPS.items() if name in item.fixturenames]
        item.add_marker(pytest.mark.xdist_group(shared[0] if shared else item.nodeid.split("::")[0]))
        if shared:
            item.add_marker(pytest.mark.slow)

@pytest.fixture(autouse=True)
def _end_started_processes(monkeypatch):
    """Whatever a test started is killed when it ends (a failed launch once left a launcher running)."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    yield
    left = reap(token)
    if left:
        print(f"killed {len(left)} process(es) the test left running:\n  " + "\n  ".join(left), file=sys.stderr)
    end_forked()  # the zygote's children (tests/zygote.py) carry the zygote's environment, not the test's token


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """The packaged SmolLM2 converted once, in a cache of its own (deleted after the session: 540 MB)."""
    from pipeline.models.pretrained import CACHE_VAR, resolve_pretrained

    root = tmp_path_factory.mktemp("gguf-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_VAR, str(root))
        start = time.perf_counter()
        folder = Path(resolve_pretrained(SPEC))
        seconds = time.perf_counter() - start
    print(f"\nconverted {GGUF_NAME} in {seconds:.1f} s", file=sys.stderr)
    yield SimpleNamespace(root=root, folder=folder, seconds=seconds)
    shutil.rmtree(root, ignore_errors=True)


# One local Ray (2 CPUs) for the whole test session, started only if a test asks for it. It is started by the
# session fixture before any test's process token is set (the fixture above sets a new one for each test and undoes
# it after), so the reaper that kills what a test left running spares Ray's head and workers: the raylet, which
# starts every worker, never carries a token.
@pytest.fixture(scope="session")
def ray_cluster():
    import ray  # in the dev extra: CI runs these tests, it does not skip them

    from pipeline.config import RayConfig
    from pipeline.data.engines.ray import engine as engine_ray

    engine_ray.start_local(RayConfig(num_cpus=2, object_store_mb=256))
    yield ray
    ray.shutdown()
