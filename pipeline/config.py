"""Typed configuration: YAML files and dotted overrides onto the schema (pipeline/schema.py: one frozen
dataclass per stage), checked on load; the entry scripts' parser and `--help`.

A YAML file maps one to one onto `Config`; `section.key=value` overrides on the command line
are parsed as YAML scalars and type-checked. An unknown key or a wrong type raises `ConfigError`
naming the key (and the closest valid one), before any work starts. `read_config` checks what the
schema alone decides (each field, and fields against each other); pipeline/checks.py adds the checks
against the task, sentence pairs and LoRA, and its `load_config` is what every command calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from pipeline import REPO_ROOT
from pipeline.schema import (  # noqa: F401 - the schema's names, imported from here by the package
    CleanConfig,
    Config,
    DedupConfig,
    EvalConfig,
    LabelConfig,
    ModelConfig,
    PeftConfig,
    PrepareConfig,
    RayConfig,
    SourceConfig,
    SplitConfig,
    TokenizeConfig,
    TrainConfig,
)

DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the key."""


# ---------------------------------------------------------------- building from dicts


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 3e-5 as a string; accept it as the float it means
            return float(value)
        except ValueError:
            pass
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown):,} characters)"
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {shown}")
    return value


MOVED = {"dedup.num_proc": "prepare.num_proc", "tokenize.num_proc": "prepare.num_proc"}  # one setting now


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    if key in MOVED:
        return ConfigError(f"config key '{key}' is now '{MOVED[key]}' (one setting for every stage); rename it")
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    hint = f"; did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}'{hint}")


def _build(cls: type, data: dict, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(prefix + str(key), names)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, {} if value is None else value, f"{prefix}{key}.")
            continue
        meta = cls.__dataclass_fields__[key].metadata
        if tp is list and isinstance(value, str) and meta.get("commas"):  # `a,b` on the command line
            value = [item.strip() for item in value.split(",") if item.strip()]
        value = _coerce(value, tp, prefix + key)
        _check_allowed(value, meta, prefix + key)
        kwargs[key] = value
    return cls(**kwargs)


_INTERVAL = re.compile(r"([\[(])(-?inf|-?\d+(?:\.\d*)?), (inf|-?\d+(?:\.\d*)?)([\])])")


def _check_allowed(value: Any, meta: Any, key: str) -> None:
    """The one place a single field's value is checked: its choices, or its range (see `opt`)."""
    texts = value if isinstance(value, list) else [value]  # lm.prompts, label.names: each item too
    bad = next((t for t in texts if isinstance(t, str) and not _is_utf8(t)), None)
    if bad is not None:  # from a non-UTF-8 argv or file name
        raise ConfigError(f"{key}: {ascii(bad)} is not valid UTF-8 text; use a UTF-8 name (rename the path)")
    choices = meta.get("choices")
    if choices and isinstance(value, list):
        wrong = [item for item in value if item not in choices]
        if wrong:
            raise ConfigError(f"{key}: {wrong[0]!r} is not one of {', '.join(map(repr, choices))}")
        twice = [item for i, item in enumerate(value) if item in value[:i]]
        if twice:
            raise ConfigError(f"{key}: {twice[0]!r} is given twice; name it once")
    elif choices and value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
    bounds = meta.get("bounds")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number{_range_text(bounds) if bounds else ''}, got {value}")
    if bounds and not _in_bounds(value, bounds):
        raise ConfigError(f"{key} must be{_range_text(bounds)}, got {value}")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Python's stand-in for an undecodable byte
        return False
    return True


def _in_bounds(value: float, bounds: str) -> bool:
    low_kind, low, high, high_kind = _INTERVAL.fullmatch(bounds).groups()
    above = value > float(low) if low_kind == "(" else value >= float(low)
    below = value < float(high) if high_kind == ")" else value <= float(high)
    return above and below


def _range_text(bounds: str) -> str:
    """'[1, inf)' -> ' >= 1'; '(0, 1]' -> ' in (0, 1]'."""
    low_kind, low, high, _ = _INTERVAL.fullmatch(bounds).groups()
    if high == "inf":
        return f" {'>=' if low_kind == '[' else '>'} {low}"
    return f" in {bounds}"


def option_type(key: str) -> Any:
    """The annotated type of the option `section.key` (or a top-level key); an unknown key, or a section, is a
    ConfigError naming it."""
    parts = key.split(".")
    cls: Any = Config
    for i, part in enumerate(parts):
        valid = [f.name for f in dataclasses.fields(cls)]
        if part not in valid:
            raise _unknown_key(".".join(parts[: i + 1]), valid)
        tp = typing.get_type_hints(cls)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise ConfigError(f"{key} is a section; set one of its keys, e.g. {key}.{dataclasses.fields(tp)[0].name}=...")
            return tp
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is not a section and has no key '{parts[i + 1]}'")
        cls = tp


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    option_type(key)  # the key names an option
    *sections, last = key.split(".")
    node = tree
    for part in sections:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    if not _is_utf8(raw):  # a command line's non-UTF-8 bytes: YAML would refuse them as unprintable
        raise ConfigError(f"{key.strip()}: {ascii(raw)} is not valid UTF-8 text; use a UTF-8 name (rename the path)")
    try:
        value = yaml.load(raw, Loader=_Yaml12Loader) if raw != "" else ""  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError):  # not YAML, or nested past Python's recursion limit: the text itself
        value = raw
    return key.strip(), value


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's booleans, true and false only: PyYAML's 1.1 rules read no/yes/on/off as
    booleans too, and `train.mixed_precision=no` (a value accelerate's own configs use) failed as "got bool"."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


class _UniqueKeyLoader(_Yaml12Loader):
    """The config's loader: refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # the base class names this error itself
            if key in seen:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"line {line}: key '{key}' is given twice in one section; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict:
    """The file's mapping of sections; every way it can be unreadable is one line naming it."""
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder; name a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: byte {e.object[e.start:e.end]!r} at offset {e.start} is not UTF-8; "
                          f"save the file as UTF-8") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}:{str(e).removeprefix('line ')}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply to read (past Python's recursion limit); a "
                          f"config is sections of keys") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got a {type(tree).__name__}")
    if (where := _lone_surrogate(tree, "")) is not None:  # "\ud83d" in a quoted string: half a character
        raise ConfigError(f"{path}: {where[0]}: {ascii(where[1])} holds a lone surrogate escape (half of a UTF-16 pair), "
                          f"not text; write the character itself, or both halves of its escape")
    return tree


def _lone_surrogate(tree: Any, key: str) -> tuple[str, str] | None:
    """(the key path, the text) of the first string in a YAML tree, key or value, that UTF-8 cannot hold."""
    if isinstance(tree, str):
        return None if _is_utf8(tree) else (key or "(top level)", tree)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        name = f"{key}[{k}]" if isinstance(tree, list) else f"{key}.{k}" if key else str(k)
        if isinstance(k, str) and not _is_utf8(k):
            return name, k
        if (found := _lone_surrogate(v, name)) is not None:
            return found
    return None


def read_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Read a YAML config (default: configs/default.yaml) and apply `key=value` overrides; every field and the
    fields against each other are checked (pipeline.checks.load_config checks the rest)."""
    path = Path(path) if path else DEFAULT_CONFIG
    tree = read_yaml(path)
    try:  # the file alone first, so that an error it holds is named as the file's
        _build(Config, tree, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    for item in overrides:  # an error from here on is an override's: it names the key, not the file
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
    cfg = _build(Config, tree, "")
    check_fields(cfg)
    return cfg


def check_fields(cfg: Config) -> None:
    """Checks across fields of the schema; each field's own range is checked as it is read (`_check_allowed`)."""
    s = cfg.split
    if abs(s.train + s.validation + s.test - 1.0) > 1e-6:
        raise ConfigError(
            f"split.train + split.validation + split.test must be 1; "
            f"got {s.train} + {s.validation} + {s.test} = {s.train + s.validation + s.test:g}"
        )
    d = cfg.dedup
    if (d.bands > 0) != (d.rows > 0) or d.bands * d.rows > d.num_perm:
        raise ConfigError(f"dedup.bands and dedup.rows go together and bands*rows <= num_perm ({d.num_perm})")
    if d.keep_test_whole and not s.use_source_split:
        raise ConfigError("dedup.keep_test_whole=true keeps the source's own test split, but "
                          "split.use_source_split=false re-splits by ratio; set one of them the other way")
    if s.chunk == "words" and s.chunk_overlap >= s.chunk_size:
        raise ConfigError(f"split.chunk_overlap must be below split.chunk_size={s.chunk_size}, got {s.chunk_overlap}")
    tr = cfg.train
    if tr.early_stopping_patience and not tr.eval_every:
        raise ConfigError(f"train.early_stopping_patience={tr.early_stopping_patience} counts validations, and "
                          f"train.eval_every=0 validates only at the end; set train.eval_every")
    if tr.early_stopping_patience and not tr.keep_best:
        raise ConfigError("train.early_stopping_patience ends the run with the best checkpoint's model, and "
                          "train.keep_best=0 keeps none; set train.keep_best to 1 or more")
    c = cfg.clean
    if c.max_chars and c.max_chars < c.min_chars:
        raise ConfigError(f"clean.max_chars ({c.max_chars}) is below clean.min_chars ({c.min_chars}): "
                          f"nothing could pass")
    m = cfg.model
    if m.from_scratch and m.hidden_size % m.num_heads:
        raise ConfigError(f"model.hidden_size={m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
    if -1 < m.attention_dropout < 0:
        raise ConfigError(f"model.attention_dropout={m.attention_dropout:g}: give -1 (keep the model's own) or a "
                          f"dropout probability in [0, 1)")
    t = cfg.tokenize
    if t.head_tokens and t.truncation != "head_tail":
        raise ConfigError(f"tokenize.head_tokens={t.head_tokens} applies to tokenize.truncation=head_tail only "
                          f"(got truncation={t.truncation}); drop it or set truncation=head_tail")
    if t.head_tokens >= t.max_length:
        raise ConfigError(f"tokenize.head_tokens={t.head_tokens} leaves no room for the tail within "
                          f"tokenize.max_length={t.max_length}; keep it below max_length less the special tokens")
    if cfg.eval.bf16 and cfg.eval.precision not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"eval.bf16=true (deprecated spelling of eval.precision=bf16) conflicts with "
                          f"eval.precision={cfg.eval.precision}; drop eval.bf16")
    _validate_runtime(cfg.eval)
    if not cfg.output_dir.strip():
        raise ConfigError("output_dir is empty: name the folder for this experiment's data and run")
    if cfg.source.format != "hub" and not cfg.source.path:
        raise ConfigError("source.path is empty: name the file or folder to read")


def _validate_runtime(e: EvalConfig) -> None:
    """eval.runtime=onnxruntime: fp32 or int8 only, and its packages installed (checked before any work)."""
    import importlib.util

    if e.runtime != "onnxruntime":
        return
    if e.bf16 or e.precision == "bf16":
        raise ConfigError("eval.runtime=onnxruntime runs eval.precision fp32 or int8, not bf16; use eval.runtime=torch for bf16")
    missing = [n for n in ("onnxruntime", "onnx") if importlib.util.find_spec(n) is None]
    if missing:
        raise ConfigError(f"eval.runtime=onnxruntime needs {' and '.join(missing)}: pip install -c constraints.txt -e '.[onnx]'")


def pretrained_tokenizer_name(cfg: Config) -> str:
    return cfg.tokenize.pretrained or cfg.model.name_or_path


# ---------------------------------------------------------------- command line


def options_help(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per option: `section.key (type, default X): meaning`."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"\n  [{f.name}] {f.metadata.get('help', '')}")
            lines += options_help(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        choices = f.metadata.get("choices")
        extra = f"; one of {'|'.join(c or repr(c) for c in choices)}" if choices else ""
        extra += f"; in {f.metadata['bounds']}" if f.metadata.get("bounds") else ""
        lines.append(f"    {prefix}{f.name} ({_type_name(tp)}, default {default!r}{extra}): {f.metadata['help']}")
    return lines


class _Parser(argparse.ArgumentParser):
    """Overrides may come before and after flags (`x=1 --quiet y=2`); plain parse_args ends the
    positional list at the first flag and calls every later override an unrecognized argument."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        return self.parse_intermixed_args(args, namespace)


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config options (set in YAML, or on the command line as section.key=value):\n"
        + "\n".join(options_help()),
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="experiment YAML (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser


def arg_overrides(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> list[str]:
    """The positional overrides, then the flag-derived ones (`extra`: key -> value, None where a flag is unset)."""
    return [*args.overrides, *(f"{key}={value}" for key, value in (extra or {}).items() if value is not None)]


def override_args(cfg: Config, path: str | Path, sections: tuple[str, ...]) -> list[str]:
    """The `key=value` overrides that turn the YAML file at `path` into `cfg`, for the keys under
    `sections`: what a suggested command must repeat so that it means the user's run."""
    base = flat(_build(Config, read_yaml(Path(path)), "").to_dict())
    return [override(key, value) for key, value in flat(cfg.to_dict()).items()
            if key.split(".")[0] in sections and base.get(key) != value]


def override(key: str, value: Any) -> str:
    """`key=value` as a command line gives it: the value in YAML flow style, read back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=float("inf")).strip()
    return f"{key}={text.removesuffix('...').strip()}"  # a plain scalar dumps as "x\n..."


def flat(tree: dict, prefix: str = "") -> dict:
    """A config dict keyed `section.key` (and top-level keys as they are)."""
    out = {}
    for k, v in tree.items():  # only the top level holds sections; label.mapping is one value
        out.update(flat(v, f"{k}.") if isinstance(v, dict) and not prefix else {prefix + k: v})
    return out


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)

