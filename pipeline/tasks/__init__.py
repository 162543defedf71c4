"""Tasks by name: the `task` config key picks one (default classification). A new task is a folder
beside classification/ and one line here (docs/adding-a-task.md)."""

from __future__ import annotations

import difflib

from pipeline.task import Task
from pipeline.tasks import causal_lm, classification, instruct, multilabel, regression

TASKS: dict[str, Task] = {
    "classification": classification.TASK,
    "causal_lm": causal_lm.TASK,
    "instruct": instruct.TASK,
    "multilabel": multilabel.TASK,
    "regression": regression.TASK,
}


def get(name: str) -> Task:
    """The task named `name`, or a one-line error naming the key and the closest task."""
    if name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(name, list(TASKS), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ValueError(f"task: {name!r} is not a task ({', '.join(sorted(TASKS))}){hint}")
