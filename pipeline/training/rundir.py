"""The run directory: refusing to mix runs, its record of what ran, metrics.jsonl and the exports.

  <output_dir>/run/
    config.yaml        the resolved config          run_info.json   versions, git commit, launches
    metrics.jsonl      one JSON object per log/eval  tensorboard/    event files (accelerate tracker)
    model_config/      config.json (id2label) + tokenizer, written at start: any checkpoint is loadable
    checkpoints/<name> see checkpoint.py            final/          save_pretrained model + tokenizer
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from pipeline import artifacts
from pipeline.config import Config, to_yaml
from pipeline.training import checkpoint

RUN_FILES = ("config.yaml", "run_info.json", "metrics.jsonl")


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / f).exists() for f in RUN_FILES) or (run_dir / "checkpoints").is_dir()


def check_run_dir(run_dir: Path, resume: str | None, config_path: str) -> None:
    """Before any work: an output directory holding another run is refused unless resuming."""
    if resume is None and holds_run(run_dir):
        have = [p.name for p, _ in checkpoint.complete_checkpoints(run_dir / "checkpoints")]
        raise FileExistsError(
            f"{run_dir} already holds a training run (checkpoints: {', '.join(have) or 'none'}); "
            f"continue it with `python pipeline/train.py --config {config_path} --resume auto`, "
            f"or set output_dir to a new folder (or delete {run_dir})"
        )


def clear_for_fresh_start(run_dir: Path) -> None:
    """`--resume auto` with no usable checkpoint starts over: remove what the earlier attempt left."""
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in ("tensorboard", "checkpoints", "final", "model_config"):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def record_launch(cfg: Config, run_dir: Path, info: dict) -> None:
    """config.yaml and run_info.json (one entry per launch: a resume appends)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    path = run_dir / "run_info.json"
    launches = artifacts.read_json(path).get("launches", []) if path.is_file() else []
    launches.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv, **info})
    artifacts.write_json_atomic(path, {
        "versions": artifacts.library_versions(), "git_commit": artifacts.git_commit(), "launches": launches,
    })


class MetricsLog:
    """metrics.jsonl on the main process; a resume first drops records after the resumed step (they
    belong to the stretch that is being redone), so the file reads like one uninterrupted run."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None):
        self.path, self.enabled = path, enabled
        if enabled and resume_step is not None and path.is_file():
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            tmp.replace(path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def export_model_config(model, tok, out: Path) -> None:
    """config.json (with id2label/label2id) and tokenizer files: what a checkpoint's weights need."""
    with artifacts.atomic_dir(out, replace=True) as tmp:
        model.config.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))


def export_final(model, tok, out: Path, state: dict | None = None) -> None:
    """save_pretrained (safetensors) + tokenizer: loadable by transformers.pipeline('text-classification').

    `state` (step, epoch, data fingerprints) goes to state.json, so evaluation can say what it scored."""
    with artifacts.atomic_dir(out, replace=True) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if state is not None:
            artifacts.write_json_atomic(tmp / "state.json", state)
