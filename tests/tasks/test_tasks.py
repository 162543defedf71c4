"""The task registry (pipeline/tasks/__init__.py) and the `task` config key."""

import dataclasses

import pytest

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.data import runner
from pipeline.task import Task


def test_the_default_task_is_classification_and_every_existing_config_means_what_it_meant():
    cfg = load_config(None)
    assert cfg.task == "classification" and tasks.get(cfg.task) is tasks.TASKS["classification"]
    assert [s.name for s in runner.stage_table(cfg, tasks.get(cfg.task))] == ["load", "clean", "dedup", "split", "label", "tokenize"]


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
        "outputs", "loss_tokens", "samples", "weighted_loss", "class_counts", "training_loss", "check_settings",
        "peft_task_type", "head", "final_config", "strata", "pipeline_tag", "model_kind", "card_data", "card_metrics",
        "sections", "predictions", "pairs", "max_tokens", "max_tokens_setting", "margins", "output_width",
        "cpu_bf16_attention"]
    for name, task in tasks.TASKS.items():
        assert task.name == name
        assert all(getattr(task, f) is not None for f in names), name
        assert task.peft_task_type in ("SEQ_CLS", "CAUSAL_LM"), name
        assert task.pipeline_tag in ("text-classification", "text-generation"), name
        assert task.card_metrics is not Task.card_metrics and task.card_data is not Task.card_data, name
        assert task.model_kind != "model" and all(hasattr(load_config(None), s) for s in task.sections), name
        assert (task.outputs is None) == (task.output_width == 0), name  # a task's own outputs say their width
        assert (task.predictions is None) == (task.samples is not None), name  # predict.py: rows scored, or text generated
        assert task.class_counts is None or task.weighted_loss is not None, name  # classes to weigh: a loss to weigh


def test_a_registered_task_supplies_the_stages_after_split(monkeypatch):
    """The runner asks the task: a task with its own stage after tokenize gets it in the table."""
    base = tasks.get("classification")
    extra = lambda cfg, tokenize: [*base.stages(cfg, tokenize), dataclasses.replace(tokenize, name="pack")]  # noqa: E731
    monkeypatch.setitem(tasks.TASKS, "packed", dataclasses.replace(base, name="packed", stages=extra))
    cfg = load_config(None, ["task=packed"])
    assert [s.name for s in runner.stage_table(cfg, tasks.get(cfg.task))][-3:] == ["label", "tokenize", "pack"]
    default = load_config(None)
    assert runner.data_config_fingerprint(cfg, tasks.get(cfg.task)) != runner.data_config_fingerprint(
        default, tasks.get(default.task))


TASK_WORDS = {*tasks.TASKS, "SEQ_CLS", "CAUSAL_LM"}  # the tasks' names and peft's task types


def _code_strings(path):
    """Every string constant of a module's code: docstrings, and the help texts of the schema's fields, left out."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    helps = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "opt"
             for arg in node.args[1:2]}
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docs | helps]


def test_shared_code_names_no_task():
    """Outside pipeline/tasks/ a task is its registry line: no string in the shared code's logic is a task's name
    or peft task type (a tuple of the tasks that take pairs, a card's per-task wording, a branch on cfg.task), so
    a new task edits no shared file (tests/tasks/tagging/ proves it end to end). The schema's default task is
    the one allowed name."""
    from pathlib import Path

    import pipeline

    root = Path(pipeline.__file__).parent
    found = [f"{path.relative_to(root)}:{line}: {value!r}"
             for path in sorted(root.rglob("*.py")) if "tasks" not in path.relative_to(root).parts
             for line, value in _code_strings(path) if value in TASK_WORDS]
    default = next(k for k, line in enumerate((root / "schema.py").read_text().splitlines(), 1)
                   if line.lstrip().startswith("task: str = opt("))  # the task field's default
    assert found == [f"schema.py:{default}: 'classification'"]
