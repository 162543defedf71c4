"""Instruction tuning: conversations (pipeline/data/io/conversation.py) rendered with the tokenizer's chat
template, the loss on the assistant's tokens only, packed into blocks or one example a row. It is causal
language modelling with a loss mask, so it shares causal_lm's model, collator, scoring and card; validation
and evaluation report perplexity and bits per byte of the answers."""

from __future__ import annotations

import dataclasses

from pipeline.data.engines.base import Stage
from pipeline.data.io import conversation
from pipeline.tasks import causal_lm
from pipeline.tasks.instruct import sample, stage


def stages(cfg, tokenize: Stage) -> list[Stage]:
    return [Stage("tokenize", stage.tokenize_conversations, stage.InstructSection.of(tokenize.section, cfg.lm))]


def data_info(manifests: dict) -> dict:
    stats = manifests["tokenize"]["stats"]
    return {**causal_lm.data_info(manifests), "template": stats["template"], "packing": stats["packing"]}


def validate(cfg) -> None:
    """causal_lm's checks, and a source of conversations whose examples stay whole."""
    causal_lm.validate(cfg)
    if not conversation.conversational(cfg.source):
        raise ValueError("task=instruct trains on conversations: set source.format=conversations (YAML), "
                         "source.messages_field (a list of {role, content}) or source.prompt_field (with text_field "
                         "the completion)")
    if cfg.split.chunk != "none":
        raise ValueError(f"split.chunk={cfg.split.chunk}: task=instruct keeps each conversation whole; set split.chunk=none")


# causal language modelling with a loss mask: causal_lm's model, collator (it honours loss_mask), scoring and card
TASK = dataclasses.replace(
    causal_lm.TASK,
    name="instruct",
    stages=stages,
    data_info=data_info,
    validate=validate,
    columns=(*causal_lm.TASK.columns, "loss_mask"),
    samples=sample.samples,
    check_settings=sample.check,
)
