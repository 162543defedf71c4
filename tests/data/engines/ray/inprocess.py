"""Ray's API as the Ray engine uses it (remote functions and their options, put, get, the cluster's CPUs), run
eagerly in this process: the engine's own code (its task bodies, the shuffles, the chains of tasks, what the
driver does with their answers) without a cluster, for the fast tier. What only a real Ray has (processes,
the object store, a worker lost, the session's Ray) stays with the tests that use the `ray_cluster` fixture."""

from __future__ import annotations

import types
from typing import Any


class Ref:
    """An object ref whose task has already run."""

    def __init__(self, value: Any):
        self.value = value


def _resolved(arg: Any) -> Any:
    return arg.value if isinstance(arg, Ref) else arg  # Ray resolves refs passed as arguments, not nested ones


class _Remote:
    def __init__(self, fn: Any, num_returns: int = 1):
        self.fn, self.num_returns = fn, num_returns

    def options(self, num_returns: int = 1, **_: Any) -> _Remote:
        return _Remote(self.fn, num_returns)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*map(_resolved, args), **{k: _resolved(v) for k, v in kwargs.items()})
        if self.num_returns == 1:
            return Ref(out)
        out = list(out)
        assert len(out) == self.num_returns, (self.fn.__name__, len(out), self.num_returns)
        return [Ref(v) for v in out]


def _get(refs: Any) -> Any:
    return [_get(r) for r in refs] if isinstance(refs, list) else refs.value


class _InProcessRay(types.ModuleType):
    """Everything else is the real module's (its exception classes, which the engine names; and whatever a
    thread of a real Ray running in this process meanwhile imports the module for)."""

    def __init__(self, real: types.ModuleType, cpus: int):
        super().__init__("ray")
        self._real = real
        self.remote = _Remote
        self.put = Ref
        self.get = _get
        self.is_initialized = lambda: True
        self.cluster_resources = lambda: {"CPU": float(cpus)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def in_process_ray(cpus: int = 2) -> types.ModuleType:
    """A stand-in for the `ray` module (put it in sys.modules['ray'] while the engine runs)."""
    import ray
    import ray.exceptions  # the real exception classes, reached through the stand-in

    return _InProcessRay(ray, cpus)
