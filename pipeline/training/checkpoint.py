"""Crash-safe checkpoints made by accelerate's save_state: into a temporary folder, flushed, manifest
last, renamed into place; read back by load_state after checks that accelerate does not make.

Layout of `<run>/checkpoints/<name>/` (this module is its one owner; evaluation asks it):
  written by accelerator.save_state (whatever the backend makes of it):
    model.safetensors        DDP / one process: weights, keys of the unwrapped model (accelerate 1.15)
    optimizer.bin            DDP / one process: the optimizer state_dict (torch.save)
    scaler.pt                fp16 gradient scaler (torch.save), when used
    random_states_<rank>.pkl accelerate's RNG pickles (torch.save); restored again below, strictly
    pytorch_model_fsdp_0/ optimizer_0/   FSDP SHARDED_STATE_DICT: DCP folders (__<rank>_0.distcp, .metadata)
    pytorch_model/           DeepSpeed: mp_rank_*_model_states.pt, *_optim_states.pt per rank; latest
  written here:
    scheduler.json           LambdaLR state (the scheduler is ours, stepped once per optimizer step)
    rng_state_<rank>.json    python/numpy/torch generator states of every process, restored last
    state.json               state_io.TrainState: position (step, epoch, batch in epoch), total steps,
                             eval metrics, best metric, NaN counts, processes, fingerprints
    manifest.json            every file of every rank, sizes and sha256; written last: marks completeness
A process killed at any point leaves either a complete checkpoint or a hidden `.<name>.tmp` folder
that nothing ever reads and the next save or rotation removes. accelerate's own rotation
(automatic_checkpoint_naming / total_limit) is never used: it deletes before the new folder exists,
and its load_state() without a folder takes the highest-numbered one unchecked.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

from pipeline import artifacts
from pipeline.artifacts import MANIFEST, read_json, write_json_atomic
from pipeline.models.lora import ADAPTER_CONFIG, ADAPTER_DIR
from pipeline.training import state_io

STATE = "state.json"
WEIGHTS = "model.safetensors"  # accelerate's SAFE_WEIGHTS_NAME for model 0
SCHEDULER = "scheduler.json"
FSDP_SHARDED = "pytorch_model_fsdp_0"  # accelerate's DCP folder of model 0 under FSDP SHARDED_STATE_DICT
FSDP_FULL = "pytorch_model_fsdp.bin"  # ... and its file under FULL_STATE_DICT
FORMAT = state_io.FORMAT  # state.json's "format": the layout above


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.json"


def save_checkpoint(acc, root: Path, name: str, model, optimizer, scheduler, state: dict,
                    run_id: str | None = None, extra=None) -> Path:
    """Every process calls this at the same step; returns the complete checkpoint's path. `model` and
    `optimizer` are the prepared ones: save_state saves what accelerate prepared. `run_id`: the run that makes
    it (the main process's), recorded in its manifest (rundir.belongs). `extra`: a function of the folder being
    written that the main process calls to add its own files (train.label_audit's record), before the manifest."""
    final, tmp = root / name, root / f".{name}.tmp"
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    try:
        acc.save_state(str(tmp))  # collectives under FSDP/DeepSpeed: every rank writes its shards
        write_json_atomic(tmp / rng_file(acc.process_index), state_io.rng_state())
        if acc.is_main_process:
            write_json_atomic(tmp / SCHEDULER, state_io.plain_state(scheduler.state_dict(), "scheduler"))
            write_json_atomic(tmp / STATE, {**state, "format": FORMAT})
            if extra is not None:
                extra(tmp)
    except artifacts.write_errors() as e:  # a full disk: torch says "unexpected pos" or "file write failed"
        full = artifacts.no_space_error(root, checkpoint_bytes(root, model), f"checkpoint {name}", e,
                                      then="continue the run with --resume auto (the checkpoints before it are intact)")
        if full is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # incomplete, never read: frees what it took; nothing else is touched
        raise full from None
    acc.wait_for_everyone()
    if not acc.is_main_process:  # flushed by the writer too: on some shared filesystems only it can
        artifacts.fsync_tree(tmp)
    acc.wait_for_everyone()
    if acc.is_main_process:
        finalize(tmp, final, run_id)  # fsyncs every file, then the manifest of every rank's files
    acc.wait_for_everyone()
    return final


def checkpoint_bytes(root: Path, model) -> int:
    """About how many bytes a checkpoint takes: the newest complete one's, else the trained weights and AdamW's
    two moments (3 x the trained parameters' bytes; a LoRA checkpoint holds only those)."""
    done = complete_checkpoints(root) if root.is_dir() else []
    if done:
        files = read_json(done[-1][0] / MANIFEST).get("files", {})
        return sum(int(f.get("bytes", 0)) for f in files.values())
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def write_manifest(folder: Path, kind: str, run_id: str | None = None) -> None:
    """manifest.json, written last: each file's size and sha256 read back from disk (artifacts), and the id of
    the run that wrote the folder."""
    artifacts.write_files_manifest(folder, kind=kind, **({"run_id": run_id} if run_id else {}))


def finalize(tmp: Path, final: Path, run_id: str | None = None) -> None:
    """Flush every file, write the manifest (hashes read back from disk) last, rename into place."""
    write_manifest(tmp, kind="checkpoint", run_id=run_id)
    artifacts.fsync_tree(tmp)
    old = None
    if final.exists():  # a corrupt checkpoint of the same name, passed over by resume
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    artifacts.fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rng_source(acc, path: Path, state: dict) -> Path:
    """This rank's RNG file. Resumed with another process count (same global batch), rank r takes
    saved rank r mod (saved count): a state of the run, never a fresh seed, but not the stream an
    uninterrupted run would have drawn (nothing can be: the ranks' streams are per process)."""
    saved = state.get("num_processes") or acc.num_processes
    f = path / rng_file(acc.process_index % saved)
    if not f.is_file():
        raise ValueError(f"{path}: no RNG state for process {acc.process_index} ({f.name} missing); "
                         f"use --resume auto to fall back to an earlier checkpoint")
    if saved != acc.num_processes and acc.is_main_process:
        warn(f"{path} was saved by {saved} processes, this run has {acc.num_processes}: same global batch, so the "
             f"same data order; each rank restores the RNG state of saved rank (rank mod {saved}), so dropout "
             f"masks differ from an uninterrupted {saved}-process run")
    return f


def load_checkpoint(acc, path: Path, model, optimizer, scheduler) -> dict:
    """Check that no file can run code, load_state, then the scheduler and this process's RNG (last,
    strictly: accelerate only logs a failed RNG restore); return state.json."""
    state = read_json(path / STATE)
    state_io.check_format(state, str(path))
    state_io.check_no_code(path)  # before accelerate or torch reads a byte of it
    rng = _rng_source(acc, path, state)
    try:
        acc.load_state(str(path))
        scheduler.load_state_dict(read_json(path / SCHEDULER))
    except Exception as e:  # noqa: BLE001 - any parse/shape failure means this checkpoint is unusable
        raise ValueError(f"{path}: cannot load checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:300]}); "
                         f"use --resume auto to fall back to an earlier one") from None
    state_io.set_rng_state(read_json(rng), str(rng))
    return state


def load_weights(path: Path, model) -> None:
    """Load a checkpoint's weights into a plain (unwrapped, unsharded) model, whatever save_state wrote:
    model.safetensors (accelerate 1.15 keys it like the unwrapped model under DDP too, and drops the
    duplicate keys of tied weights, which safetensors' load_model restores), or FSDP's DCP folder or
    full-state file. Every pickle in the folder is first read as data only. ValueError naming what
    does not fit."""
    state_io.check_no_code(path)
    if (path / WEIGHTS).is_file():
        from safetensors.torch import load_model

        missing, unexpected = load_model(model, str(path / WEIGHTS), strict=False)
    else:
        if (path / FSDP_SHARDED).is_dir():
            import torch.distributed.checkpoint as dcp

            holder = {"model": model.state_dict()}
            dcp.load(holder, checkpoint_id=str(path / FSDP_SHARDED), no_dist=True)  # reads every rank's shard
            weights = holder["model"]
        elif (path / FSDP_FULL).is_file():
            import torch

            weights = torch.load(path / FSDP_FULL, map_location="cpu", weights_only=True)
        else:
            raise ValueError(f"{path} holds no weights this project can read ({WEIGHTS}, {FSDP_SHARDED}/ or "
                             f"{FSDP_FULL}); a DeepSpeed checkpoint is read by resume only: evaluate final/ instead")
        missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: the weights do not fit the model: missing {list(missing)[:5]}, "
                         f"unexpected {list(unexpected)[:5]}")


# ---------------------------------------------------------------- finding, checking, rotating


def verify(path: Path, deep: bool = True) -> str | None:
    """None when `path` is a complete, intact checkpoint (or final/ export); otherwise the reason it is not."""
    reason = artifacts.check_files(path, deep)
    if reason is not None:
        return reason
    try:
        if (path / STATE).is_file() or not (is_final(path) or is_adapter(path)):
            read_json(path / STATE)
    except (ValueError, FileNotFoundError) as e:
        return f"unreadable ({e})"
    return None


def is_final(path: Path) -> bool:
    """A save_pretrained export (final/): config.json and weights in the folder itself, or (a LoRA run with
    peft.merge_final=false) config.json and the adapter folder."""
    return (path / "config.json").is_file() and ((path / WEIGHTS).is_file() or (path / ADAPTER_DIR).is_dir())


def is_adapter(path: Path) -> bool:
    """A LoRA run's exported adapter (final/adapter/: peft's adapter_config.json and weights)."""
    return (path / ADAPTER_CONFIG).is_file()


def export_of(path: Path) -> Path:
    """The final/ export a folder belongs to: final/adapter/ is part of final/; anything else is itself."""
    return path.parent if is_adapter(path) and is_final(path.parent) else path


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
    # the best first; of equal values the earliest, the step state.json's best names (state_io.Best.offer)
    ranked = sorted(((v, -s["step"], p) for p, s in done if (v := _rank_value(s)) is not None), reverse=True)
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
        ranked = [(v, -s["step"], p) for p, s in done if (v := _rank_value(s)) is not None]  # ties: the earliest
        if not ranked:
            raise FileNotFoundError(f"no checkpoint in {root} has validation metrics (checkpoints: {have})")
        return max(ranked)[2]
    path = Path(name)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {name!r} not found; use final, best, last or one of: {have}")
    if is_final(path) or is_adapter(path):
        return path
    reason = verify(path, deep=False)
    if reason:
        raise ValueError(f"checkpoint {path} is not usable: {reason}; complete ones in {root}: {have}")
    return path


def run_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint (<run>/checkpoints/<name>) or final export (<run>/final) belongs to."""
    checkpoint = export_of(checkpoint)
    return checkpoint.parent if is_final(checkpoint) else checkpoint.parent.parent


def model_config_dir(checkpoint: Path) -> Path:
    """Where the config and tokenizer for a checkpoint's weights live: the folder itself for `final`,
    otherwise `<run>/model_config` (written at the start of training)."""
    if (checkpoint / "config.json").is_file():
        return checkpoint
    return run_of(checkpoint) / "model_config"


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
