"""The sweep file (configs/sweeps/*.yaml) of pipeline/sweep.py: its keys, and its search space as Optuna
distributions, every key a config option and every end of every range a config that loads."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.checks import load_config
from pipeline.config import ConfigError, option_type, override, read_yaml

SPEC_KEYS = {"name", "trials", "seed", "metric", "sampler", "startup_trials", "pruner", "pruner_startup_trials",
             "pruner_warmup_steps", "params"}


@dataclass(frozen=True)
class Spec:
    """The sweep file (configs/sweeps/*.yaml)."""
    name: str
    trials: int
    params: dict  # config key -> {low, high[, log, step]} or {choices: [...]}
    seed: int = 0
    metric: str = ""  # empty: train.metric_for_best
    sampler: str = "tpe"  # tpe or random
    startup_trials: int = 4  # tpe: random trials before the model of good and bad trials takes over
    pruner: str = "median"  # median or none
    pruner_startup_trials: int = 2  # trials finished before any is pruned
    pruner_warmup_steps: int = 0  # no pruning at validations before this step
    source: dict = field(default_factory=dict)


def read_spec(path: Path) -> Spec:
    """The sweep file, every problem one line naming the file and key."""
    tree = read_yaml(path)
    where = str(path)
    unknown = set(tree) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'; the keys are {', '.join(sorted(SPEC_KEYS))}")
    for key in ("name", "trials", "params"):
        if key not in tree:
            raise ConfigError(f"{where}: '{key}' is missing")
    hints = typing.get_type_hints(Spec)
    values = {}
    for key, value in tree.items():
        tp = hints[key]
        if tp is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"{where}: {key}: expected a whole number >= 0, got {value!r}")
        if tp is str and not isinstance(value, str):
            raise ConfigError(f"{where}: {key}: expected text, got {value!r}")
        values[key] = value
    if values["trials"] < 1:
        raise ConfigError(f"{where}: trials: expected at least 1, got {values['trials']}")
    if not values["name"] or "/" in values["name"] or values["name"].startswith("."):
        raise ConfigError(f"{where}: name: {values['name']!r} must be a plain folder name")
    for key, choices in (("sampler", ("tpe", "random")), ("pruner", ("median", "none"))):
        if key in values and values[key] not in choices:
            raise ConfigError(f"{where}: {key}: {values[key]!r} is not one of {', '.join(map(repr, choices))}")
    if not isinstance(values["params"], dict) or not values["params"]:
        raise ConfigError(f"{where}: params: expected a mapping of config keys to ranges or choices")
    return Spec(**values, source=tree)


def distributions(spec: Spec, cfg_path: Path, overrides: list[str], where: str) -> dict:
    """Optuna distributions of the space; each key checked to be a config key whose every bound loads."""
    import optuna.distributions as od

    out = {}
    for key, d in spec.params.items():
        at = f"{where}: params.{key}"
        if not isinstance(d, dict):
            raise ConfigError(f"{at}: expected {{low: ..., high: ...[, log: true]}} or {{choices: [...]}}, got {d!r}")
        try:
            tp = option_type(key)
        except ConfigError as e:
            raise ConfigError(f"{at}: {e}") from None
        if "choices" in d:
            extra = set(d) - {"choices"}
            choices = d["choices"]
            if extra or not isinstance(choices, list) or not choices:
                raise ConfigError(f"{at}: expected {{choices: [a, b, ...]}} alone, got {d!r}")
            if any(not isinstance(c, (int, float, str, bool)) for c in choices):
                raise ConfigError(f"{at}: choices must be numbers, text or true/false, got {choices!r}")
            dist, bounds = od.CategoricalDistribution(choices), choices
        else:
            extra = set(d) - {"low", "high", "log", "step"}
            if extra or "low" not in d or "high" not in d:
                raise ConfigError(f"{at}: expected low and high (and optionally log, step), got {d!r}")
            low, high, log, step = d["low"], d["high"], bool(d.get("log", False)), d.get("step")
            if tp not in (int, float) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                 for x in (low, high)):
                raise ConfigError(f"{at}: a range needs a number option and numbers low/high; use choices for {key}")
            if not low < high:
                raise ConfigError(f"{at}: low ({low}) must be below high ({high})")
            try:
                if tp is int:
                    dist = od.IntDistribution(int(low), int(high), log=log, step=int(step or 1))
                else:
                    dist = od.FloatDistribution(float(low), float(high), log=log, step=step)
            except ValueError as e:
                raise ConfigError(f"{at}: {e}") from None
            bounds = [low, high]
        for value in bounds:  # every end of the space is a valid config
            try:
                load_config(cfg_path, [*overrides, override(key, value)])
            except ConfigError as e:
                raise ConfigError(f"{at}: {value!r}: {e}") from None
        out[key] = dist
    return out
