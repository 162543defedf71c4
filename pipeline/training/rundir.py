"""The run directory: refusing to mix runs, its record of what ran, metrics.jsonl and the exports.

  <output_dir>/run/
    config.yaml        the resolved config          run_info.json   versions, git commit, launches
    metrics.jsonl      one JSON object per log/eval  tensorboard/    event files (and the other trackers' stores,
                                                                     pipeline/training/trackers.py)
    model_config/      config.json (id2label) + tokenizer, written at start: any checkpoint is loadable
    checkpoints/<name> see checkpoint.py            final/          save_pretrained model + tokenizer
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pipeline import artifacts
from pipeline.config import Config, to_yaml
from pipeline.models import lora
from pipeline.training import checkpoint

RUN_FILES = ("config.yaml", "run_info.json", "metrics.jsonl", "trackers.json", "mlflow.db")


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / f).exists() for f in RUN_FILES) or (run_dir / "checkpoints").is_dir()


def check_run_dir(run_dir: Path, resume: str | None, config_path: str) -> None:
    """Before any work: an output directory holding another run is refused unless resuming."""
    if resume is None and holds_run(run_dir):
        have = [p.name for p, _ in checkpoint.complete_checkpoints(run_dir / "checkpoints")]
        raise FileExistsError(
            f"{run_dir} already holds a training run (checkpoints: {', '.join(have) or 'none'}); "
            f"continue it with `python pipeline/train.py --config {config_path} --resume auto`, "
            f"start over with --restart (its files are moved to {run_dir / SET_ASIDE}/), or set output_dir to a new folder"
        )


# .onnx: exports of final/; the trackers' own stores (train.report_to) besides tensorboard/
RUN_DIRS = ("tensorboard", "checkpoints", "final", "model_config", "eval", ".onnx", "mlflow-artifacts", "wandb", ".aim")
SET_ASIDE = "set_aside"  # <run>/set_aside/<time>/: earlier attempts moved out of the way, never deleted


def check_fresh_start(run_dir: Path, config_path: str) -> None:
    """`--resume auto` found no intact checkpoint. A finished model is never replaced unless asked."""
    final = run_dir / "final"
    if (final / "config.json").is_file():
        raise FileExistsError(
            f"--resume auto: {run_dir} holds a finished model ({final}) but no intact checkpoint to continue from; "
            f"evaluate it with `python pipeline/evaluate.py --config {config_path}`, train anew in another "
            f"output_dir, or rerun with --restart instead of --resume to set this run aside "
            f"(moved to {run_dir / SET_ASIDE}/) and start over")


def set_aside(run_dir: Path) -> Path | None:
    """Move what an earlier attempt left (history, checkpoints, exports) to set_aside/<time>/; nothing is deleted."""
    present = [run_dir / n for n in (*RUN_FILES, *RUN_DIRS) if (run_dir / n).exists()]
    if not present:
        return None
    dest = run_dir / SET_ASIDE / time.strftime("%Y%m%d-%H%M%S")
    while dest.exists():
        dest = dest.with_name(dest.name + "-1")
    dest.mkdir(parents=True)
    for p in present:
        os.rename(p, dest / p.name)
    artifacts.fsync_path(run_dir)
    return dest


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


def first_budget(run_dir: Path) -> dict | None:
    """The time budget the run's first launch fixed (run_info.json), or None for a run without one."""
    path = run_dir / "run_info.json"
    try:
        launches = artifacts.read_json(path).get("launches", []) if path.is_file() else []
    except ValueError:
        return None
    return next((x["budget"] for x in launches if isinstance(x, dict) and isinstance(x.get("budget"), dict)), None)


class MetricsLog:
    """metrics.jsonl on the main process; a resume first drops records after the resumed step (they
    belong to the stretch that is being redone), so the file reads like one uninterrupted run. A last
    line torn by a crash mid-write is dropped with a warning; any other unreadable line is kept as is."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None):
        self.path, self.enabled = path, enabled
        if enabled and resume_step is not None and path.is_file():
            kept = _records_up_to(path, resume_step)
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            tmp.replace(path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def read_records(path: Path) -> list[dict]:
    """metrics.jsonl's records, in order; a line being written (or torn) and anything not an object passed over."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _records_up_to(path: Path, step: int) -> list[str]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                checkpoint.warn(f"{path}:{number}: dropped a torn last line (a write cut short): {line[:60]!r}")
            else:
                checkpoint.warn(f"{path}:{number}: kept a line that is not JSON: {line[:60]!r}")
                kept.append(line)
            continue
        if not isinstance(record, dict) or record.get("step", 0) <= step:
            kept.append(line)
    return kept


def export_model_config(model, tok, out: Path) -> None:
    """config.json (with id2label/label2id) and tokenizer files: what a checkpoint's weights need."""
    with artifacts.atomic_dir(out, replace=True) as tmp:
        model.config.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if lora.is_adapted(model):  # the adapter's settings and its base, for loading a checkpoint
            model.peft_config["default"].save_pretrained(str(tmp))


def export_final(model, tok, out: Path, state: dict | None = None, weights: dict | None = None,
                 merge: bool = True) -> None:
    """save_pretrained (safetensors) + tokenizer: loadable by transformers.pipeline() with the task's pipeline tag.

    `state` (step, epoch, data fingerprints) goes to state.json, so evaluation can say what it scored.
    `weights`: the full state dict (accelerator.get_state_dict) where the model's own is sharded (FSDP, ZeRO-3).
    An adapted model (peft): adapter/ and, with `merge`, the merged weights (lora.write_final)."""
    try:
        with artifacts.atomic_dir(out, replace=True) as tmp:  # a failed export leaves the earlier final/ as it was
            if lora.is_adapted(model):
                lora.write_final(model, tok, tmp, merge)
            else:
                model.save_pretrained(str(tmp), safe_serialization=True, state_dict=weights)
            tok.save_pretrained(str(tmp))
            if state is not None:
                artifacts.write_json_atomic(tmp / "state.json", state)
            checkpoint.write_manifest(tmp, kind="final")  # evaluation verifies what it loads against it
    except artifacts.write_errors() as e:  # a full disk, however the library words it
        needed = sum(p.numel() * p.element_size() for p in model.parameters())
        full = artifacts.no_space_error(out.parent, needed, f"the final export {out.name}/", e)
        if full is None:
            raise
        raise full from None
