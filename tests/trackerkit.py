"""Reading a run's trackers back through each tracker's own client, for the tests: {key: {step: value}} of
every scalar, the parameters, and the tracker runs that exist; and in_process, around a run or an evaluation
that opens trackers in the test's own process."""

from __future__ import annotations

import json
import struct
import sys
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def in_process():
    """Trackers opened in this process leave nothing behind for what runs after: W&B starts a service process for
    this one (ended here). (MLflow's setting of MLFLOW_TRACKING_URI the pipeline puts back itself: trackers._make.)"""
    try:
        yield
    finally:
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()


def _last_per_step(pairs) -> dict[str, dict[int, float]]:
    """(key, step, value) in logging order -> the last value per step (a resume logs its redone steps again)."""
    out: dict[str, dict[int, float]] = {}
    for key, step, value in pairs:
        out.setdefault(key, {})[int(step)] = value
    return out


def mlflow_scalars(run: Path, run_id: str) -> tuple[dict, dict, int]:
    """(scalars, params, number of runs in the store) from MLflow's client on the run's sqlite store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{(run / 'mlflow.db').resolve()}")
    got = client.get_run(run_id)
    pairs = []
    for key in got.data.metrics:
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)  # logging order
        pairs += [(key, m.step, m.value) for m in history]
    runs = sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())
    return _last_per_step(pairs), dict(got.data.params), runs


def aim_scalars(run: Path, run_hash: str) -> tuple[dict, dict, int]:
    """(scalars, hparams, number of runs) from Aim's Repo, after indexing the run as `aim up` does."""
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    repo = Repo.from_path(str(run))
    RepoIndexManager.get_index_manager(repo).index(run_hash)
    got = Repo.from_path(str(run)).get_run(run_hash)
    scalars = {m.name: {int(step): v[0] for step, v in m.data.items()} for m in got.metrics()}
    return scalars, got["hparams"], len(repo.list_all_runs())


def _wandb_records(path: Path):
    """The records of a .wandb transaction log (a LevelDB-style log: 32 KiB blocks of chunks with a 7-byte header:
    crc32, length, type FULL/FIRST/MIDDLE/LAST), each parsed with wandb's own protobuf Record. wandb 0.31 has no
    Python reader of its own (its Go core reads these files)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (kind == 0 and length == 0) or pos + 7 + length > len(data):
            break  # the end, or a record cut short by a killed writer
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def wandb_scalars(run: Path, run_id: str) -> tuple[dict, dict, int]:
    """(scalars, config, number of offline runs of this id: one per launch) from the offline runs' logs."""
    files = sorted(run.glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb"), key=lambda p: p.parent.name)
    pairs, config = [], {}
    for f in files:
        for record in _wandb_records(f):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = items.pop("_step")
                pairs += [(k, step, v) for k, v in items.items() if not k.startswith("_")]
            elif kind == "config":
                config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.config.update})
    return _last_per_step(pairs), config, len(files)


def tensorboard_scalars(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pairs = []
    for events in sorted((run / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        pairs += [(tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    return _last_per_step(pairs)


def expected_scalars(run: Path) -> dict:
    """metrics.jsonl as the trackers receive it: train/<key> per log record, eval/<metric> per validation."""
    pairs = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if "eval" in r:
            pairs += [(f"eval/{k}", r["step"], v) for k, v in r["eval"].items() if k != "examples"]
        elif "loss" in r and "event" not in r:
            pairs += [(f"train/{k}", r["step"], v) for k, v in r.items()
                      if k not in ("step", "epoch", "tokens", "steps", "seconds")]
    return _last_per_step(pairs)
