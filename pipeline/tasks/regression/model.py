"""The regressor: classification's AutoModelForSequenceClassification with one output named after the target,
and problem_type "regression", so transformers' forward computes MSELoss and `pipeline("text-classification")`
returns the raw score (no sigmoid or softmax)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.tasks.classification import model as classification_model

PROBLEM_TYPE = "regression"


def build_model(cfg, tok, info: dict) -> Any:
    """A new one-output model (pretrained or from the config, as classification builds it) for `info["target"]`."""
    model = classification_model.build_model(cfg, tok, {"label_names": [info["target"]]})
    model.config.problem_type = PROBLEM_TYPE
    return model


def check_model(model: Any, info: dict, ckpt: Path) -> None:
    """The checkpoint must be a regressor: one output and problem_type regression."""
    conf = model.config
    if conf.num_labels != 1 or conf.problem_type != PROBLEM_TYPE:
        raise ValueError(f"checkpoint {ckpt} is not a regression model: it has {conf.num_labels} outputs and "
                         f"problem_type {conf.problem_type!r} (config.json); evaluate with the config it was trained with")
