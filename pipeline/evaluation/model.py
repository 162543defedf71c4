"""Which weights to evaluate, and loading them as a classifier whose labels match the data.

Run directory contract (written by training):
  final/                     save_pretrained model (config.json + model.safetensors) and tokenizer
  checkpoints/<name>/        model.safetensors (unwrapped state_dict) + state.json; complete iff manifest.json
  model_config/              config.json the checkpoint weights load into (from_config)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import artifacts

WEIGHTS = "model.safetensors"


def _is_final_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / WEIGHTS).is_file()


def resolve_checkpoint(run_dir: str | Path, name: str) -> Path:
    """final, best, last, a checkpoint's folder name under checkpoints/, or a directory -> the folder to load.

    Training's resolver decides (it knows which checkpoint is best); a bare name is looked up
    under <run_dir>/checkpoints/ first so `--checkpoint step-200` works as well as the full path.
    """
    from pipeline.training.checkpoint import resolve_checkpoint as training_resolve

    named = Path(run_dir) / "checkpoints" / name
    if name not in ("final", "best", "last") and "/" not in name and named.is_dir():
        name = str(named)
    return Path(training_resolve(Path(run_dir), name))


def _model_config_dir(ckpt: Path, run_dir: Path) -> Path:
    """model_config/ of the run the checkpoint belongs to (checkpoints/<name>/../../model_config)."""
    for candidate in (ckpt.parent.parent / "model_config", run_dir / "model_config"):
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"checkpoint {ckpt} has weights but no model_config/config.json beside its run "
        f"({ckpt.parent.parent / 'model_config'}); cannot build the model to load them into"
    )


def load_classifier(ckpt: Path, run_dir: str | Path) -> Any:
    """A final/ directory (from_pretrained) or a complete checkpoint (from_config + its state_dict)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if _is_final_dir(ckpt):
        return AutoModelForSequenceClassification.from_pretrained(ckpt)
    if (ckpt / "config.json").is_file():
        raise FileNotFoundError(f"{ckpt} has config.json but no {WEIGHTS}: the model was not (fully) saved; "
                                f"train again or pick a checkpoint")
    if not artifacts.is_complete(ckpt):
        raise FileNotFoundError(
            f"checkpoint {ckpt} is incomplete (no {artifacts.MANIFEST}: its save was interrupted); "
            f"pick another checkpoint"
        )
    if not (ckpt / WEIGHTS).is_file():
        raise FileNotFoundError(f"checkpoint {ckpt} has no {WEIGHTS}")
    from safetensors.torch import load_file

    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(_model_config_dir(ckpt, Path(run_dir))))
    result = model.load_state_dict(load_file(str(ckpt / WEIGHTS)), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{ckpt / WEIGHTS} does not fit the model in model_config/: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    return model


def model_label_names(model: Any) -> list[str]:
    id2label = {int(k): v for k, v in model.config.id2label.items()}
    return [id2label[i] for i in range(len(id2label))]


def check_labels(model: Any, data_labels: list[str], ckpt: Path) -> None:
    """The classifier's label set (id2label, in id order) must be the prepared data's."""
    names = model_label_names(model)
    if names != list(data_labels):
        raise ValueError(
            f"label mismatch: checkpoint {ckpt} predicts {names} (config id2label) but the prepared data has "
            f"{list(data_labels)}; evaluate with the config the model was trained with"
        )


def checkpoint_step(ckpt: Path) -> int:
    """Optimizer step of a checkpoint (from its state.json), 0 when unknown; the TensorBoard x value."""
    state = ckpt / "state.json"
    if not state.is_file():
        return 0
    value = artifacts.read_json(state)
    return int(value.get("step", value.get("global_step", 0))) if isinstance(value, dict) else 0


def training_data_fingerprint(ckpt: Path) -> str | None:
    """Fingerprint of the prepared data the weights were trained on: a checkpoint's state.json, or for
    final/ the run's run_info.json (last launch); None when neither says."""
    try:
        if (ckpt / "state.json").is_file():
            return artifacts.read_json(ckpt / "state.json")["fingerprints"]["data"]
        return artifacts.read_json(ckpt.parent / "run_info.json")["launches"][-1]["fingerprints"]["data"]
    except (FileNotFoundError, ValueError, KeyError, IndexError, TypeError):
        return None
