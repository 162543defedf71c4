"""Test-only launcher: run pipeline/train.py's real main with the model's training loss made NaN on every
training forward pass from the N-th on, as a diverged run's would be (any task: the hook wraps what the
task builds). The product code path is untouched.

    python nan_at.py N train.py-args...
"""

import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline import tasks  # noqa: E402

first, argv = int(sys.argv[1]), sys.argv[2:]
calls = {"n": 0}


def poison(module, args, out):
    if module.training:
        calls["n"] += 1
        if calls["n"] >= first:  # the model's own loss, or what the task's own loss reads (causal_lm's hidden states)
            if out.loss is not None:
                out.loss = out.loss * float("nan")
            if getattr(out, "hidden_states", None) is not None:
                out.hidden_states = (*out.hidden_states[:-1], out.hidden_states[-1] * float("nan"))
    return out


def poisoned(build):
    def build_model(*a, **k):
        model = build(*a, **k)
        model.register_forward_hook(poison)
        return model

    return build_model


for name, task in list(tasks.TASKS.items()):
    tasks.TASKS[name] = dataclasses.replace(task, build_model=poisoned(task.build_model))

from pipeline.train import main  # noqa: E402

sys.exit(main(argv))
