"""Answers to fixed questions (lm.prompts), each asked as a user message through the chat template the data
was rendered with: before training (step 0), at each validation and by evaluate.py (causal_lm's sampling, its
RNG fork included)."""

from __future__ import annotations

from typing import Any

from pipeline.tasks.causal_lm.sample import check_prompts, generate


def _ask(tok: Any, question: str) -> Any:
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)


def samples(model: Any, tok: Any, cfg: Any, step: int) -> list[dict]:
    """[{"step", "prompt", "text"}]: the text is the answer alone, up to the end-of-turn token."""
    return generate(model, tok, cfg, step, _ask, answer_only=True)


def check(model: Any, tok: Any, cfg: Any) -> None:
    check_prompts(model, tok, cfg, _ask)
