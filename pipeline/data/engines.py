"""Which engine runs the stages (prepare.engine), opened once per prepare and only when a stage
has to run: a fully cached rerun never starts or joins Ray.

Neither engine is part of a stage's fingerprint (the cache keys do not depend on the engine): the
local engine's code is in common.py and the stage modules, which are fingerprinted; the Ray
engine moves data and calls the same functions, and its output equals the local one (tested).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from pipeline.data.common import LocalEngine


class StageFailed(RuntimeError):
    """A stage could not finish for a reason that is not the input's (a Ray worker lost for good)."""


class _Opened:
    def __init__(self, cfg: Any):
        self.cfg, self.engine = cfg, None

    def get(self) -> Any:
        if self.engine is None:
            if self.cfg.prepare.engine == "ray":
                from pipeline.data.engine_ray import RayEngine

                self.engine = RayEngine.connect(self.cfg.ray)
            else:
                self.engine = LocalEngine(self.cfg.prepare.num_proc)
        return self.engine

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()


@contextlib.contextmanager
def open_engine(cfg: Any) -> Iterator[_Opened]:
    """The engine of `cfg` (created by `.get()`); a Ray that this prepare started is stopped after."""
    opened = _Opened(cfg)
    try:
        yield opened
    finally:
        opened.close()
