"""Reading what prepare wrote: the tokenized splits, the tokenizer and the class names."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.config import Config, override_args
from pipeline.task import Task

# what every task's prepared data depends on (model: the pretrained tokenizer's name), and where it goes; a task's
# own sections (Task.sections: label, lm) come on top
DATA_SECTIONS = ("output_dir", "task", "source", "clean", "dedup", "split", "tokenize", "model")


def prepare_command(cfg: Config, task: Task, config_path: str) -> str:
    """The prepare command that makes `cfg`'s data: its file plus the user's overrides of it."""
    args = ["python", "pipeline/prepare.py", "--config", config_path]
    if Path(config_path).is_file():
        args += override_args(cfg, config_path, (*DATA_SECTIONS, *task.sections))
    return shlex.join(args)


@dataclass
class Prepared:
    splits: Any  # datasets.DatasetDict with input_ids, attention_mask, length, label, id, text, chunk
    tokenizer_dir: Path
    info: dict  # what the task recorded about its data (Task.data_info; classification: label_names)
    fingerprint: str  # content_fingerprint of the last stage: what the data is, whichever code made it
    stage_dir: Path  # the tokenize stage's folder; runner.stage_manifests reads the chain behind it


def load_prepared(cfg: Config, task: Task, config_path: str = "<config>") -> Prepared:
    """Load the prepared data `cfg` and its task (`task`, the one `cfg.task` names) make, or explain which prepare
    command makes it."""
    from pipeline.data.runner import PREPARED, content_problem, data_config_fingerprint, load_stage, stage_content

    pointer = cfg.data_dir / PREPARED
    cmd = prepare_command(cfg, task, config_path)
    if not pointer.is_file():
        raise FileNotFoundError(f"no prepared data at {cfg.data_dir}: run `{cmd}` first")
    try:
        info = artifacts.read_json(pointer)
    except ValueError as e:  # damaged on disk; prepare writes it again
        raise ValueError(f"{e}; run `{cmd}` to write it again") from None
    if info.get("config_fingerprint") != data_config_fingerprint(cfg, task):
        raise ValueError(
            f"the prepared data in {cfg.data_dir} was made with other data settings than this config; "
            f"run `{cmd}` again (it reuses every stage that did not change)"
        )
    stage_dir = Path(info["stage_dir"])
    if not artifacts.is_complete(stage_dir):
        raise FileNotFoundError(f"prepared data {stage_dir} is missing or incomplete: run `{cmd}`")
    man = artifacts.read_json(stage_dir / artifacts.MANIFEST)
    problem = content_problem(stage_dir, man)
    if problem:  # nothing derived is trained on or scored unchecked
        raise ValueError(f"prepared data {stage_dir} {problem}; rebuild it with `{cmd} --from {man.get('stage', '')}`")
    return Prepared(
        splits=load_stage(stage_dir, "tokenize", cmd),
        tokenizer_dir=stage_dir / "tokenizer",
        info=dict(info.get("data_info", {})),
        fingerprint=info.get("content_fingerprint") or stage_content(stage_dir, man),
        stage_dir=stage_dir,
    )


def longest_example(prep: Prepared, cfg: Config, task: Task) -> int:
    """The most tokens one example of the prepared data may hold, what a model's positions must cover: the task's
    answer (Task.max_tokens; a language model's blocks), else tokenize.max_length."""
    return task.max_tokens(cfg, prep.info) if task.max_tokens is not None else cfg.tokenize.max_length


def is_same_data(recorded: str | None, prep: Prepared) -> bool:
    """Did a run that recorded data fingerprint `recorded` train on `prep`? Runs record the data's content
    fingerprint; a run of an older version recorded its last stage's folder fingerprint, which covers
    the code that made it: that folder, if it is still beside this one, is compared by content."""
    from pipeline.data.runner import stage_content

    if recorded == prep.fingerprint:
        return True
    if not recorded or not all(c in "0123456789abcdef" for c in recorded):
        return False
    for folder in prep.stage_dir.parent.glob(f"*-{recorded}"):
        if artifacts.is_complete(folder):
            try:
                return stage_content(folder, artifacts.read_json(folder / artifacts.MANIFEST)) == prep.fingerprint
            except (OSError, ValueError):
                return False
    return False
