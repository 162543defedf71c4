"""The multilabel label stage and strata on Ray equal the local engine's at 1, 2 and 7 blocks."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest

from pipeline.config import LabelConfig, RayConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.engines.local import LocalEngine
from pipeline.tasks.multilabel import label

pytestmark = pytest.mark.slow  # the session's Ray (tests/conftest.py); the local engine's side is in the fast tier

BLOCKS = [1, 2, 7]


def _engine(blocks: int):
    import ray

    from pipeline.data.engines.ray.engine import RayEngine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    return RayEngine.connect(RayConfig(blocks=blocks))


def _split(tmp_path):
    """400 rows of 0-3 labels of five (one rare), as list marks or commas; every ninth without a label; a few 'z'."""
    import datasets

    rng = random.Random(7)
    names = ["a", "b", "c", "d", "rare"]

    def raw(k):
        picked = rng.sample(names[:4], rng.randint(0, 3)) + (["rare"] if k % 50 == 3 else []) + (["z"] if k % 97 == 5 else [])
        return "" if k % 9 == 0 else (label.LIST if k % 2 else ", ").join(picked)

    labels = [raw(k) for k in range(400)]
    ds = datasets.Dataset.from_dict({"id": [f"d{k:04d}" for k in range(400)], "text": [f"t {k}" for k in range(400)],
                                     "label": labels, "chunk": [0] * 400})
    ds.save_to_disk(str(tmp_path / "docs"))
    ds = datasets.load_from_disk(str(tmp_path / "docs"))  # memory-mapped, as a stage's input is
    return ds, datasets.DatasetDict({"train": ds.select(range(300)), "validation": ds.select(range(300, 360)),
                                     "test": ds.select(range(360, 400))})


@pytest.mark.parametrize("blocks", BLOCKS)
def test_label_and_strata_on_ray_equal_local(tmp_path, ray_cluster, blocks):
    ds, dd = _split(tmp_path)
    cfg = LabelConfig(names=["a", "b", "c", "d", "rare"], unknown="drop")
    out = {}
    for name, engine in (("local", LocalEngine()), ("ray", _engine(blocks))):
        (tmp_path / name).mkdir()
        with engine.stage(tmp_path / name / "stage"):
            r = label.label(dd, cfg, StageContext(out_dir=tmp_path / name, engine=engine, progress=False))
        rows = {s: (d.features, d.to_list()) for s, d in r.data.items()}
        stratum = label.strata(SimpleNamespace(label=cfg), ds, engine)
        out[name] = (rows, r.dropped, r.stats, [stratum(x) for x in ds["label"][:]])
    assert out["ray"] == out["local"]
    assert out["local"][2]["unknown_label"] == {"z": 5} and out["local"][2]["rows_without_labels"]["train"] > 0
    assert out["local"][3].count("rare") == 7  # 8 rows have it, one (153) is emptied
    with pytest.raises(ValueError, match=r"^labels outside label.names \['a', 'b', 'c', 'd', 'rare'\]: 'z' \(5 rows"):
        label.label(dd, LabelConfig(names=cfg.names), StageContext(out_dir=tmp_path / "error", engine=_engine(blocks)))
