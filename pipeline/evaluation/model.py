"""Which weights to evaluate, and loading them as the task's model.

The run directory's layout belongs to pipeline/training/checkpoint.py (and rundir.py); this module
asks them where things are. Whatever is loaded is first verified against its manifest (sizes and
sha256), as resume does: a flipped byte is an error naming the file, never a score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.models import lora
from pipeline.training import checkpoint


def resolve_checkpoint(run_dir: str | Path, name: str) -> Path:
    """final, best, last, a checkpoint's folder name under checkpoints/, or a directory -> the folder to load.

    Training's resolver decides (it knows which checkpoint is best); a bare name is looked up
    under <run_dir>/checkpoints/ first so `--checkpoint step-200` works as well as the full path.
    """
    named = Path(run_dir) / "checkpoints" / name
    if name not in ("final", "best", "last") and "/" not in name and named.is_dir():
        name = str(named)
    return Path(checkpoint.resolve_checkpoint(Path(run_dir), name))


def _verified(ckpt: Path) -> None:
    if checkpoint.is_final(ckpt) and not (ckpt / artifacts.MANIFEST).is_file():
        checkpoint.warn(f"{ckpt} has no {artifacts.MANIFEST} (exported by an older version): loaded unverified")
        return
    reason = checkpoint.verify(ckpt, deep=True)
    if reason:
        raise ValueError(f"{ckpt} is not usable: {reason}; pick another checkpoint (--checkpoint best|last|NAME)")


def load_model(ckpt: Path, run_dir: str | Path, auto_class: Any) -> Any:
    """A final/ directory (from_pretrained) or a complete checkpoint (from_config + its state_dict), as
    the task's transformers Auto class (`Task.model_class()`). A LoRA run's adapter (final/adapter/, final/
    without merged weights, or a checkpoint of one) is put on its base and merged: a plain model again."""
    from transformers import AutoConfig

    if (ckpt / "config.json").is_file() and not (checkpoint.is_final(ckpt) or checkpoint.is_adapter(ckpt)):
        raise FileNotFoundError(f"{ckpt} has config.json but no {checkpoint.WEIGHTS}: the model was not (fully) "
                                f"saved; train again or pick a checkpoint")
    _verified(ckpt)
    adapter = _adapter_of(ckpt, run_dir)
    if adapter is not None:
        folder, config_dir = adapter
        sharded = not checkpoint.is_adapter(folder) and not (folder / checkpoint.WEIGHTS).is_file()  # FSDP's DCP
        return lora.load_for_inference(folder, config_dir, auto_class, _trained_base(ckpt),
                                           checkpoint.load_weights if sharded else None)
    if checkpoint.is_final(ckpt):
        return auto_class.from_pretrained(ckpt)
    config_dir = _model_files(ckpt, run_dir)
    if not (config_dir / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {ckpt} has weights but no {config_dir / 'config.json'} beside its run; "
                                f"cannot build the model to load them into")
    model = auto_class.from_config(AutoConfig.from_pretrained(config_dir))
    checkpoint.load_weights(ckpt, model)  # whatever save_state wrote (DDP prefix, FSDP shards), checked first
    return model


def _adapter_of(ckpt: Path, run_dir: str | Path) -> tuple[Path, Path] | None:
    """(the adapter's folder or checkpoint, the folder with its labelled config and adapter_config.json), or
    None for a model trained in full (or a final/ with the adapter merged: that loads as a plain model)."""
    if checkpoint.is_adapter(ckpt):
        return ckpt, ckpt
    if checkpoint.is_final(ckpt):
        inner = ckpt / lora.ADAPTER_DIR
        return (inner, inner) if not (ckpt / checkpoint.WEIGHTS).is_file() else None
    config_dir = _model_files(ckpt, run_dir)
    return (ckpt, config_dir) if (config_dir / lora.ADAPTER_CONFIG).is_file() else None


def _trained_base(ckpt: Path) -> dict | None:
    """The base model a LoRA checkpoint or export recorded (state.json's fingerprints), None where none did."""
    state = checkpoint.export_of(ckpt) / "state.json"
    try:
        return artifacts.read_json(state).get("fingerprints", {}).get("base") if state.is_file() else None
    except ValueError:
        return None


def _model_files(ckpt: Path, run_dir: str | Path) -> Path:
    """Where the config and tokenizer of `ckpt`'s weights are: final/ itself, the checkpoint's run's
    model_config/, or (a checkpoint copied out of its run) this run's."""
    folder = checkpoint.model_config_dir(ckpt)
    return folder if (folder / "config.json").is_file() else Path(run_dir) / "model_config"


def check_same_vocabulary(ckpt: Path, run_dir: str | Path, prepared_tokenizer: Path) -> None:
    """Every token of the prepared data's tokenizer has the id the model was trained with (the model's
    may add a pad token after them); a checkpoint whose tokenizer is not beside it is not checked here."""
    from tokenizers import Tokenizer

    theirs = _model_files(ckpt, run_dir) / "tokenizer.json"
    if not theirs.is_file() or not (prepared_tokenizer / "tokenizer.json").is_file():
        return
    model_vocab = Tokenizer.from_file(str(theirs)).get_vocab()
    data_vocab = Tokenizer.from_file(str(prepared_tokenizer / "tokenizer.json")).get_vocab()
    differ = sorted(t for t, i in data_vocab.items() if model_vocab.get(t) != i)
    if differ:
        t = differ[0]
        raise ValueError(f"checkpoint {ckpt} was trained with another vocabulary than the prepared data's "
                         f"({prepared_tokenizer}): {len(differ)} of its {len(data_vocab)} tokens differ ({t!r} is id "
                         f"{model_vocab.get(t)} there, {data_vocab[t]} here); evaluate with the config the model was "
                         f"trained with")


def checkpoint_step(ckpt: Path) -> int:
    """Optimizer step of a checkpoint (from its state.json), 0 when unknown; the TensorBoard x value."""
    state = checkpoint.export_of(ckpt) / "state.json"
    if not state.is_file():
        return 0
    value = artifacts.read_json(state)
    return int(value.get("step", value.get("global_step", 0))) if isinstance(value, dict) else 0


def training_data_fingerprint(ckpt: Path) -> str | None:
    """Fingerprint of the prepared data the weights were trained on: a checkpoint's state.json, or for
    final/ the run's run_info.json (last launch); None when neither says."""
    ckpt = checkpoint.export_of(ckpt)
    try:
        if (ckpt / "state.json").is_file():
            return artifacts.read_json(ckpt / "state.json")["fingerprints"]["data"]
        return artifacts.read_json(ckpt.parent / "run_info.json")["launches"][-1]["fingerprints"]["data"]
    except (FileNotFoundError, ValueError, KeyError, IndexError, TypeError):
        return None
