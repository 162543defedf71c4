"""prepare with several processes gives the same output as with one: every stage's saved dataset,
row by row, its side files (duplicate clusters, leakage report) and its counts.

10,000 real tweets (the embedded default's corpus) because the stages only fan out above a size
where processes pay for themselves: clean maps in 2 processes from 10,000 rows (one per 5,000),
MinHash signs in 2 from 4,000 documents (one per 2,000). The pretrained tokenizer keeps tokenize
deterministic (a tokenizer trained twice may number tied tokens differently, whatever num_proc is).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.config import DEFAULT_CONFIG
from pipeline.data import runner
from tests.stagecheck import stable

ROWS = 10_000
# per-run values that legitimately differ between the two runs
VOLATILE = {"seconds", "signature_processes", "created", "created_at", "fingerprint", "input_fingerprint", "num_proc"}


def _prepare(tmp_path: Path, num_proc: int) -> Path:
    tree = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    tree["output_dir"] = str(tmp_path / f"np{num_proc}")
    tree["source"]["max_rows"] = ROWS
    tree["prepare"] = {"num_proc": num_proc}
    path = tmp_path / f"np{num_proc}.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    cfg = load_config(path)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    return cfg.data_dir / "stages"


def _stage_dirs(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if not p.name.startswith(".")), key=lambda p: int(p.name.split("-")[0]))


def _tables(stage: Path) -> dict:
    """split name -> rows (a plain Dataset is the single split '')."""
    import datasets

    data = datasets.load_from_disk(str(stage / "data"))
    parts = data.items() if isinstance(data, datasets.DatasetDict) else [("", data)]
    return {name: (d.features, d.to_list()) for name, d in parts}


@pytest.mark.slow
def test_prepare_with_two_processes_equals_one_process(tmp_path):
    one, two = _stage_dirs(_prepare(tmp_path, 1)), _stage_dirs(_prepare(tmp_path, 2))
    assert [p.name.split("-")[1] for p in one] == [p.name.split("-")[1] for p in two] == ["load", "clean", "dedup", "split", "label", "tokenize"]
    man = {p.name.split("-")[1]: json.loads((p / "manifest.json").read_text()) for p in two}
    assert man["dedup"]["stats"]["signature_processes"] == 2  # the comparison is of a real 2-process run
    assert man["clean"]["rows_in"] >= 2 * 5000  # clean's threshold for 2 processes
    for a, b in zip(one, two):
        ta, tb = _tables(a), _tables(b)
        assert ta.keys() == tb.keys(), a.name
        for split in ta:
            assert ta[split][0] == tb[split][0], f"{a.name} {split}: features differ"
            rows_a, rows_b = ta[split][1], tb[split][1]
            assert len(rows_a) == len(rows_b), f"{a.name} {split}"
            diff = next((i for i, (x, y) in enumerate(zip(rows_a, rows_b)) if x != y), None)
            assert diff is None, f"{a.name} {split} row {diff}: {rows_a[diff]} != {rows_b[diff]}"
        for side in ("clusters.jsonl", "leakage.jsonl"):
            if (a / side).exists() or (b / side).exists():
                assert (a / side).read_bytes() == (b / side).read_bytes(), f"{a.name}/{side}"
        ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
        assert stable(ma, VOLATILE) == stable(mb, VOLATILE), a.name  # rows in/out, drops by reason, stats
    dedup = man["dedup"]
    assert dedup["dropped"].get("near_duplicate", 0) > 0  # MinHash found something to agree on
