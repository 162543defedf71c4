"""The config checks that compose sections with what sits above the config: the task (its own sections and
metrics), sentence pairs against the task, and LoRA against the model and task. config.py checks what the
schema alone decides and imports nothing of the pipeline; this module is where a command loads its config.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipeline import tasks
from pipeline.config import Config, ConfigError, arg_overrides, read_config
from pipeline.data.io import pair
from pipeline.models import lora


def validate(cfg: Config) -> None:
    """Sentence pairs, the task's own checks (classification: label.*, train.metric_for_best) and peft's, before
    any work; each problem is a ConfigError naming its key."""
    try:
        task = tasks.get(cfg.task)
        pair.check_config(cfg, [name for name, t in tasks.TASKS.items() if t.pairs])
        task.validate(cfg)
        lora.check_config(cfg)
        _check_loss_settings(cfg, task)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_loss_settings(cfg: Config, task) -> None:
    """train.label_smoothing and train.class_weights need a task with classes (Task.weighted_loss)."""
    t = cfg.train
    set_ = [k for k, on in (("train.label_smoothing", t.label_smoothing), ("train.class_weights", t.class_weights)) if on]
    if set_ and task.weighted_loss is None:
        with_classes = ", ".join(name for name, other in tasks.TASKS.items() if other.weighted_loss is not None)
        raise ConfigError(f"{' and '.join(set_)}: task={cfg.task} has no classes to smooth or weigh; they apply to "
                          f"{with_classes}")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Read a YAML config (default: configs/default.yaml), apply `key=value` overrides, and check all of it."""
    cfg = read_config(path, overrides)
    validate(cfg)
    return cfg


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Config:
    """The config of an entry script's command line: --config, positional overrides and flag-derived ones."""
    return load_config(args.config, arg_overrides(args, extra))
