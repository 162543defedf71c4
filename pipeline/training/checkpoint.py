"""Crash-safe checkpoints: write to a temporary folder, flush, manifest last, rename into place.

Layout of `<run>/checkpoints/<name>/`:
  model.safetensors        weights, keys of the unwrapped model's state_dict
  optimizer.safetensors    optimizer tensors;  optimizer.json: groups and scalars
  scheduler.json           LambdaLR state;      scaler.json: fp16 gradient scaler (when used)
  rng_state_<rank>.json    python/numpy/torch generator states of every process
  state.json               training position (step, epoch, batch in epoch), best metric, eval metrics
  manifest.json            files, sizes and sha256; written last: its presence marks completeness
A process killed at any point leaves either a complete checkpoint or a hidden `.<name>.tmp` folder
that nothing ever reads and the next save or rotation removes.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.artifacts import MANIFEST, file_sha256, read_json, write_json_atomic
from pipeline.training import state_io

STATE = "state.json"
WEIGHTS = "model.safetensors"


def write_main_files(tmp: Path, weights: dict, optimizer, scheduler, scaler, state: dict) -> None:
    """The files only the main process writes (the model and optimizer are the same on every rank)."""
    from safetensors.torch import save_file

    seen, tensors = set(), {}
    for key, t in weights.items():  # safetensors refuses shared storage (tied weights): copy duplicates
        t = t.detach().cpu().contiguous()
        tensors[key] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
    state_io.save_optimizer(optimizer.state_dict(), tmp / "optimizer.safetensors", tmp / "optimizer.json")
    write_json_atomic(tmp / "scheduler.json", state_io.plain_state(scheduler.state_dict(), "scheduler"))
    if scaler is not None:
        write_json_atomic(tmp / "scaler.json", state_io.plain_state(scaler.state_dict(), "gradient scaler"))
    write_json_atomic(tmp / STATE, state)


def write_manifest(folder: Path, kind: str) -> None:
    """Flush every file of `folder`, then write manifest.json: each file's size and sha256 read back from disk."""
    files = {}
    for p in sorted(q for q in folder.rglob("*") if q.is_file() and q.name != MANIFEST):
        artifacts.fsync_path(p)
        files[str(p.relative_to(folder))] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    write_json_atomic(folder / MANIFEST, artifacts.manifest(kind=kind, files=files))


def finalize(tmp: Path, final: Path) -> None:
    """Flush every file, write the manifest (hashes read back from disk) last, rename into place."""
    write_manifest(tmp, kind="checkpoint")
    artifacts.fsync_tree(tmp)
    old = None
    if final.exists():  # a corrupt checkpoint of the same name, passed over by resume
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    artifacts.fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(acc, root: Path, name: str, model, optimizer, scheduler, state: dict) -> Path:
    """Every process calls this at the same step; returns the complete checkpoint's path."""
    final, tmp = root / name, root / f".{name}.tmp"
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    write_json_atomic(tmp / f"rng_state_{acc.process_index}.json", state_io.rng_state())
    weights = acc.get_state_dict(model)  # a collective under FSDP/DeepSpeed; unwrapped keys
    if acc.is_main_process:
        write_main_files(tmp, weights, optimizer, scheduler, acc.scaler, state)
    acc.wait_for_everyone()
    if acc.is_main_process:
        finalize(tmp, final)
    acc.wait_for_everyone()
    return final


def load_checkpoint(acc, path: Path, model, optimizer, scheduler) -> dict:
    """Restore weights, optimizer, scheduler, scaler and this process's RNG; return state.json."""
    from safetensors.torch import load_file

    state = read_json(path / STATE)
    try:  # safetensors and JSON only: a planted pickle fails to parse, it never runs
        acc.unwrap_model(model).load_state_dict(load_file(str(path / WEIGHTS)))
        optimizer.load_state_dict(state_io.load_optimizer(path / "optimizer.safetensors", path / "optimizer.json"))
        scheduler.load_state_dict(state_io.read_plain(path / "scheduler.json"))
        if acc.scaler is not None:
            acc.scaler.load_state_dict(state_io.read_plain(path / "scaler.json"))
    except Exception as e:  # noqa: BLE001 - any parse/shape failure means this checkpoint is unusable
        raise ValueError(f"{path}: cannot load checkpoint ({type(e).__name__}: {e}); "
                         f"use --resume auto to fall back to an earlier one") from None
    rng_file = path / f"rng_state_{acc.process_index}.json"
    if not rng_file.is_file():
        raise ValueError(f"{path}: no RNG state for process {acc.process_index} ({rng_file.name} missing)")
    state_io.set_rng_state(read_json(rng_file), str(rng_file))
    return state


# ---------------------------------------------------------------- finding, checking, rotating


def verify(path: Path, deep: bool = True) -> str | None:
    """None when `path` is a complete, intact checkpoint (or final/ export); otherwise the reason it is not."""
    if not (path / MANIFEST).is_file():
        return "incomplete (no manifest.json)"
    try:
        files = read_json(path / MANIFEST)["files"]
        for rel, info in files.items():
            p = path / rel
            if not p.is_file():
                return f"{rel} is missing"
            if p.stat().st_size != info["bytes"]:
                return f"{rel} has {p.stat().st_size} bytes, manifest says {info['bytes']}"
            if deep and file_sha256(p) != info["sha256"]:
                return f"{rel} does not match its sha256 in the manifest"
        if (path / STATE).is_file() or not is_final(path):
            read_json(path / STATE)
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
        return f"unreadable ({e})"
    return None


def is_final(path: Path) -> bool:
    """A save_pretrained export (final/): config.json and weights in the folder itself."""
    return (path / "config.json").is_file() and (path / WEIGHTS).is_file()


def complete_checkpoints(root: Path) -> list[tuple[Path, dict]]:
    """(path, state) of every checkpoint with a manifest, oldest step first; the step comes from
    state.json, never from the folder name."""
    out = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p.name.startswith(".") or not p.is_dir() or not (p / MANIFEST).is_file():
            continue
        try:
            out.append((p, read_json(p / STATE)))
        except (ValueError, FileNotFoundError):
            continue
    return sorted(out, key=lambda ps: ps[1].get("step", -1))


def find_resume(root: Path) -> tuple[Path | None, list[str]]:
    """The newest intact checkpoint, and one warning per newer one passed over (naming it)."""
    warnings = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if not p.is_dir() or p.name.startswith("."):
            continue
        if not (p / MANIFEST).is_file():
            warnings.append(f"skipping incomplete checkpoint {p} (no manifest.json: its save was interrupted)")
            continue
        try:
            read_json(p / STATE)
        except (ValueError, FileNotFoundError) as e:
            warnings.append(f"skipping corrupt checkpoint {p}: {STATE} unreadable ({e})")
    for path, _ in reversed(complete_checkpoints(root)):
        reason = verify(path, deep=True)
        if reason is None:
            return path, warnings
        warnings.append(f"skipping corrupt checkpoint {path}: {reason}")
    return None, warnings


def _rank_value(state: dict) -> float | None:
    best = state.get("best") or {}
    value = (state.get("metrics") or {}).get(best.get("metric", ""))
    if value is None:
        return None
    return value if best.get("greater_is_better", True) else -value


def rotate(root: Path, keep_last: int, keep_best: int) -> list[Path]:
    """Delete complete checkpoints outside the newest `keep_last` and the best `keep_best`, and stale
    temporary folders. Called only after the newest checkpoint is complete; it is always kept."""
    done = complete_checkpoints(root)
    keep = {p for p, _ in done[-max(1, keep_last):]}
    healthy = last_healthy(done)
    if healthy is not None:  # saved during a run of skipped updates, the newest ones may all be unhealthy
        keep.add(healthy)
    ranked = sorted(((v, s["step"], p) for p, s in done if (v := _rank_value(s)) is not None), reverse=True)
    keep |= {p for _, _, p in ranked[:keep_best]}
    removed = [p for p, _ in done if p not in keep]
    removed += [p for p in root.iterdir() if p.is_dir() and p.name.startswith(".")]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def last_healthy(done: list[tuple[Path, dict]]) -> Path | None:
    """The newest checkpoint saved outside a streak of skipped non-finite updates."""
    for path, state in reversed(done):
        if not (state.get("nan") or {}).get("in_a_row"):
            return path
    return None


def resolve_checkpoint(run_dir: str | Path, name: str) -> Path:
    """`final`, `best`, `last`, or a path -> the folder to load; a clear error listing what exists."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    done = complete_checkpoints(root)
    have = ", ".join(p.name for p, _ in done) or "none"
    if name == "final":
        if not (run_dir / "final" / "config.json").is_file():
            raise FileNotFoundError(f"{run_dir}/final does not exist (training did not finish); "
                                    f"checkpoints: {have}; use best, last or a checkpoint path")
        return run_dir / "final"
    if name in ("last", "best"):
        if not done:
            raise FileNotFoundError(f"no complete checkpoint in {root}")
        if name == "last":
            return done[-1][0]
        ranked = [(v, s["step"], p) for p, s in done if (v := _rank_value(s)) is not None]
        if not ranked:
            raise FileNotFoundError(f"no checkpoint in {root} has validation metrics (checkpoints: {have})")
        return max(ranked)[2]
    path = Path(name)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {name!r} not found; use final, best, last or one of: {have}")
    if is_final(path):
        return path
    reason = verify(path, deep=False)
    if reason:
        raise ValueError(f"checkpoint {path} is not usable: {reason}; complete ones in {root}: {have}")
    return path


def model_config_dir(checkpoint: Path) -> Path:
    """Where the config and tokenizer for a checkpoint's weights live: the folder itself for `final`,
    otherwise `<run>/model_config` (written at the start of training)."""
    if (checkpoint / "config.json").is_file():
        return checkpoint
    return checkpoint.parent.parent / "model_config"


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def describe_state(state: dict[str, Any]) -> str:
    return f"step {state['step']} (epoch {state['epoch']}, batch {state['batch_in_epoch']} of that epoch)"
