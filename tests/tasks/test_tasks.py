"""The task registry (pipeline/tasks/__init__.py) and the `task` config key."""

import dataclasses

import pytest

from pipeline import tasks
from pipeline.config import ConfigError, load_config
from pipeline.data import runner
from pipeline.task import Task


def test_the_default_task_is_classification_and_every_existing_config_means_what_it_meant():
    cfg = load_config(None)
    assert cfg.task == "classification" and tasks.get(cfg.task) is tasks.TASKS["classification"]
    assert [s.name for s in runner.stage_table(cfg)] == ["load", "clean", "dedup", "split", "label", "tokenize"]


def test_an_unknown_task_is_one_line_naming_the_key_and_the_closest():
    with pytest.raises(ConfigError, match=r"^task: 'clasification' is not a task \(causal_lm, classification, instruct, "
                                          r"multilabel, regression\); did you mean "
                                          r"'classification'\?$"):
        load_config(None, ["task=clasification"])


def test_metric_for_best_is_one_of_the_tasks_metrics():
    assert tasks.get("classification").metrics == {"accuracy": True, "macro_f1": True, "loss": False}
    with pytest.raises(ConfigError, match=r"^train.metric_for_best: 'perplexity' is not one of 'accuracy', 'macro_f1', "
                                          r"'loss' \(the classification task's metrics\)$"):
        load_config(None, ["train.metric_for_best=perplexity"])


def test_every_field_of_the_contract_is_filled_by_every_task():
    """Every field without a default (the optional ones, outputs, loss_tokens, samples, final_config, strata and
    LoRA's head, have None as theirs); every task names its peft task type, so peft.method=lora works for each, and its hub pipeline
    tag and headline figures, so its model card has them."""
    names = [f.name for f in dataclasses.fields(Task) if f.default is dataclasses.MISSING]
    assert [f.name for f in dataclasses.fields(Task) if f.name not in names] == [
        "outputs", "loss_tokens", "samples", "peft_task_type", "head", "final_config", "strata", "pipeline_tag",
        "card_metrics"]
    for name, task in tasks.TASKS.items():
        assert task.name == name
        assert all(getattr(task, f) is not None for f in names), name
        assert task.peft_task_type in ("SEQ_CLS", "CAUSAL_LM"), name
        assert task.pipeline_tag in ("text-classification", "text-generation"), name
        assert task.card_metrics is not Task.card_metrics, name


def test_a_registered_task_supplies_the_stages_after_split(monkeypatch):
    """The runner asks the task: a task with its own stage after tokenize gets it in the table."""
    base = tasks.get("classification")
    extra = lambda cfg, tokenize: [*base.stages(cfg, tokenize), dataclasses.replace(tokenize, name="pack")]  # noqa: E731
    monkeypatch.setitem(tasks.TASKS, "packed", dataclasses.replace(base, name="packed", stages=extra))
    cfg = load_config(None, ["task=packed"])
    assert [s.name for s in runner.stage_table(cfg)][-3:] == ["label", "tokenize", "pack"]
    assert runner.data_config_fingerprint(cfg) != runner.data_config_fingerprint(load_config(None))
