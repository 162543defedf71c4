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
import uuid
from pathlib import Path

from pipeline import artifacts
from pipeline.config import Config, to_yaml
from pipeline.models import lora
from pipeline.training import checkpoint

RUN_FILES = ("config.yaml", "run_info.json", "metrics.jsonl", "trackers.json", "mlflow.db")


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / f).exists() for f in RUN_FILES) or (run_dir / "checkpoints").is_dir()


def stepped(run_dir: Path) -> bool:
    """Whether the run in `run_dir` got as far as a training step: a checkpoint (even one cut short), a final export,
    or a record in metrics.jsonl. A launch that failed before that left only its launch record (config.yaml,
    run_info.json, model_config/, the trackers' new runs): nothing anyone would resume."""
    ckpts = run_dir / "checkpoints"
    return (ckpts.is_dir() and any(ckpts.iterdir())) or (run_dir / "final").exists() \
        or bool(read_records(run_dir / "metrics.jsonl"))


def check_run_dir(run_dir: Path, resume: str | None, config_path: str, main: bool = True) -> None:
    """Before any work: an output directory holding another run is refused unless resuming. One whose every launch
    failed before its first step is set aside (the main process moves it, run_dir/set_aside/<time>/) and this
    launch starts the run: a plain rerun after such a failure is never refused."""
    if resume is None and holds_run(run_dir) and not stepped(run_dir):
        if main:
            dest = set_aside(run_dir)
            print(f"{run_dir} held a launch that stopped before its first step; moved it to {dest}", flush=True)
        return
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


def record_launch(cfg: Config, run_dir: Path, info: dict) -> str:
    """config.yaml and run_info.json (one entry per launch: a resume appends). Returns the run's id: made at its
    first launch (or the first since runs had ids), kept by every resume, new after --restart (set_aside moves
    run_info.json away)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    path = run_dir / "run_info.json"
    old = artifacts.read_json(path) if path.is_file() else {}
    launches = old.get("launches", [])
    launches.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv, **info})
    rid = old.get("run_id") if isinstance(old.get("run_id"), str) else uuid.uuid4().hex
    artifacts.write_json_atomic(path, {
        "run_id": rid, "versions": artifacts.library_versions(), "git_commit": artifacts.git_commit(),
        "launches": launches,
    })
    return rid


def _recorded_id(path: Path) -> str | None:
    """The `run_id` a JSON record holds; None where it holds none or cannot be read."""
    try:
        value = artifacts.read_json(path).get("run_id")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def run_id(run_dir: Path) -> str | None:
    """The id run_info.json gives the run in `run_dir`; None for none (or a run from before runs had ids)."""
    return _recorded_id(run_dir / "run_info.json")


def made_by(folder: Path) -> str | None:
    """The id of the run that wrote a checkpoint or final export (its manifest.json); None where it says none."""
    return _recorded_id(checkpoint.export_of(folder) / artifacts.MANIFEST)


def belongs(run_dir: Path, folder: Path) -> bool:
    """Whether a checkpoint or final export is the run in `run_dir`'s own, by identity: the run id its manifest
    records against run_info.json's. Where name, place or a copy would mislead (a model set aside by --restart
    under run_dir/set_aside/, another run's checkpoint copied into checkpoints/), the ids differ. Only a folder
    or run written before runs had ids is judged by the run folder its layout puts it in (checkpoint.run_of)."""
    mine, theirs = run_id(run_dir), made_by(folder)
    if mine is not None and theirs is not None:
        return mine == theirs
    return checkpoint.run_of(Path(folder).resolve()) == Path(run_dir).resolve()


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
                 merge: bool = True, run_id: str | None = None) -> None:
    """save_pretrained (safetensors) + tokenizer: loadable by transformers.pipeline() with the task's pipeline tag.

    `state` (step, epoch, data fingerprints) goes to state.json, so evaluation can say what it scored.
    `weights`: the full state dict (accelerator.get_state_dict) where the model's own is sharded (FSDP, ZeRO-3).
    An adapted model (peft): adapter/ and, with `merge`, the merged weights (lora.write_final).
    `run_id`: the run that made it, in its manifest (belongs)."""
    try:
        with artifacts.atomic_dir(out, replace=True) as tmp:  # a failed export leaves the earlier final/ as it was
            if lora.is_adapted(model):
                lora.write_final(model, tok, tmp, merge)
            else:
                model.save_pretrained(str(tmp), safe_serialization=True, state_dict=weights)
            tok.save_pretrained(str(tmp))
            if state is not None:
                artifacts.write_json_atomic(tmp / "state.json", state)
            checkpoint.write_manifest(tmp, kind="final", run_id=run_id)  # evaluation checks what it loads by it
    except artifacts.write_errors() as e:  # a full disk, however the library words it
        needed = sum(p.numel() * p.element_size() for p in model.parameters())
        full = artifacts.no_space_error(out.parent, needed, f"the final export {out.name}/", e)
        if full is None:
            raise
        raise full from None
