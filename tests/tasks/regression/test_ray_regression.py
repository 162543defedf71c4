"""The regression label stage and strata on Ray equal the local engine's at 1, 2 and 7 blocks."""

from __future__ import annotations

import random
import sys

import pytest

from pipeline.config import LabelConfig, RayConfig, SplitConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.tasks.regression import label, strata

pytestmark = pytest.mark.slow  # the session's Ray (tests/conftest.py); the local engine's side is in the fast tier

BLOCKS = [1, 2, 7]


def _engine(blocks: int):
    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    return RayEngine.connect(RayConfig(blocks=blocks))


def _split(tmp_path):
    """400 rows of targets in [0, 5], every ninth without one, a few outside [0, 5] or not numbers."""
    import datasets

    rng = random.Random(7)
    labels = ["" if k % 9 == 0 else "x" if k % 97 == 5 else f"{rng.uniform(-0.2, 5.2):.2f}" for k in range(400)]
    ds = datasets.Dataset.from_dict({"id": [f"d{k:04d}" for k in range(400)], "text": [f"t {k}" for k in range(400)],
                                     "label": labels, "chunk": [0] * 400})
    ds.save_to_disk(str(tmp_path / "docs"))
    ds = datasets.load_from_disk(str(tmp_path / "docs"))  # memory-mapped, as a stage's input is
    return ds, datasets.DatasetDict({"train": ds.select(range(300)), "validation": ds.select(range(300, 360)),
                                     "test": ds.select(range(360, 400))})


@pytest.mark.parametrize("blocks", BLOCKS)
def test_label_and_strata_on_ray_equal_local(tmp_path, ray_cluster, blocks):
    ds, dd = _split(tmp_path)
    cfg = LabelConfig(scale=[0, 5], unknown="drop")
    out = {}
    for name, engine in (("local", LocalEngine()), ("ray", _engine(blocks))):
        (tmp_path / name).mkdir()
        with engine.stage(tmp_path / name / "stage"):
            r = label.label(dd, cfg, StageContext(out_dir=tmp_path / name, engine=engine, progress=False))
        rows = {s: (d.features, d.to_list()) for s, d in r.data.items()}
        stratum = strata.strata(type("Cfg", (), {"split": SplitConfig()})(), ds, engine)
        out[name] = (rows, r.dropped, r.stats, [stratum(x) for x in ds["label"][:]])
    assert out["ray"] == out["local"]
    assert set(out["local"][1]) == {"missing_label", "unknown_label", "outside_scale"}
    with pytest.raises(ValueError, match=r"^label: document 'd0005' has target 'x', not a number"):
        label.label(dd, LabelConfig(), StageContext(out_dir=tmp_path / "error", engine=_engine(blocks)))
