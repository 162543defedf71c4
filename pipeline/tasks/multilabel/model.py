"""The multi-label classifier: classification's model, with problem_type multi_label_classification, so its forward
takes BCEWithLogitsLoss and transformers.pipeline() gives each label's sigmoid; and the check before evaluating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.tasks.classification import evaluate as single
from pipeline.tasks.classification import model

PROBLEM = "multi_label_classification"
THRESHOLDS = "label_thresholds"  # the config.json attribute final_config sets: {label name: threshold}


def build_model(cfg, tok, info: dict):
    """classification's new classifier for `info["label_names"]` (pretrained, or BERT/GPT-2 from the config), as a
    multi-label one."""
    built = model.build_model(cfg, tok, info)
    built.config.problem_type = PROBLEM
    return built


def check_model(trained: Any, info: dict, ckpt: Path) -> None:
    """The model's labels (id2label) must be the data's, and it must be multi-label. Its thresholds (config.json's
    label_thresholds, where training saved them) go into `info["thresholds"]`, which evaluate reads."""
    single.check_labels(trained, info["label_names"], ckpt)
    problem = getattr(trained.config, "problem_type", None)
    if problem != PROBLEM:
        raise ValueError(f"checkpoint {ckpt} has problem_type {problem!r} (config.json), not {PROBLEM!r}: it was not "
                         f"trained with task=multilabel")
    saved = getattr(trained.config, THRESHOLDS, None)
    if saved is not None:
        if sorted(saved) != sorted(info["label_names"]):
            raise ValueError(f"checkpoint {ckpt} has {THRESHOLDS} for {sorted(saved)} (config.json), not for its "
                             f"labels {info['label_names']}")
        info["thresholds"] = {n: float(saved[n]) for n in info["label_names"]}
