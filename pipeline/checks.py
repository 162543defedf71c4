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
    """train.label_smoothing needs a task with a loss of targets to smooth (Task.weighted_loss), train.class_weights
    one with classes to weigh (Task.class_counts), train.label_audit and label.review_file one with a single label
    per row (Task.margins; docs/label-audit.md)."""
    t = cfg.train
    for key, on, field, what in (("train.label_smoothing", t.label_smoothing, "weighted_loss", "targets to smooth"),
                                 ("train.class_weights", t.class_weights, "class_counts", "classes to weigh"),
                                 ("train.label_audit", t.label_audit, "margins", "single label per row to audit"),
                                 ("label.review_file", cfg.label.review_file, "margins", "single label per row to review")):
        if on and getattr(task, field) is None:
            takers = ", ".join(name for name, other in tasks.TASKS.items() if getattr(other, field) is not None)
            raise ConfigError(f"{key}: task={cfg.task} has no {what}; it applies to {takers}")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Read a YAML config (default: configs/default.yaml), apply `key=value` overrides, and check all of it."""
    cfg = read_config(path, overrides)
    validate(cfg)
    return cfg


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> Config:
    """The config of an entry script's command line: --config, positional overrides and flag-derived ones."""
    return load_config(args.config, arg_overrides(args, extra))
