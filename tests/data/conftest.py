"""One local Ray (2 CPUs) for the whole test session, started only if a test asks for it.

It is started by the session fixture before any test's process token is set (tests/conftest.py
sets a new one for each test and undoes it after), so the reaper that kills what a test left
running spares Ray's head and workers: the raylet, which starts every worker, never carries a token.
"""

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray  # in the dev extra: CI runs these tests, it does not skip them

    from pipeline.config import RayConfig
    from pipeline.data.engines.ray import engine as engine_ray

    engine_ray.start_local(RayConfig(num_cpus=2, object_store_mb=256))
    yield ray
    ray.shutdown()
