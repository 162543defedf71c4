"""predict.py for the language-model tasks: continuations (causal_lm) or answers (instruct) of prompts, and a chat.

A run whose prepared data recorded a chat template (data info `template`: instruct) is asked through it, one user
message (the chat keeps every turn); any other continues the prompt as plain text. The settings are checked against
the model before anything runs: a prompt plus max_new_tokens must fit its positions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")


def positions(model: Any) -> int | None:
    conf = model.config
    return getattr(conf, "max_position_embeddings", None) or getattr(conf, "n_positions", None)


def encoder(tok: Any, info: dict) -> Callable[[list[dict]], Any]:
    """messages -> model inputs: through the chat template the data was rendered with, else the last message's text."""
    if info.get("template"):
        return lambda messages: tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                        return_dict=True)
    return lambda messages: tok(messages[-1]["content"], return_tensors="pt")


def check_fits(model: Any, n_prompt: int, sampling: Sampling, what: str) -> None:
    limit = positions(model)
    if n_prompt == 0:
        raise ValueError(f"{what} encodes to no token: give it some text")
    if limit and n_prompt + sampling.max_new_tokens > limit:
        raise ValueError(f"{what} is {n_prompt} tokens and --max-new-tokens {sampling.max_new_tokens} needs "
                         f"{n_prompt + sampling.max_new_tokens} positions; the model has {limit}: lower "
                         f"--max-new-tokens to {max(limit - n_prompt, 0)} or shorten it")


def generate(model: Any, tok: Any, ids: dict, sampling: Sampling) -> str:
    """The new tokens' text after the encoded prompt `ids` (up to the end token), seeded by sampling.seed."""
    import torch

    greedy = sampling.temperature == 0
    options = {} if greedy else {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(sampling.seed)
        out = model.generate(**ids, max_new_tokens=sampling.max_new_tokens, do_sample=not greedy, use_cache=True,
                             pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None
                             else tok.eos_token_id, eos_token_id=tok.eos_token_id, **options)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def answers(model: Any, tok: Any, info: dict, prompts: list[str], sampling: Sampling) -> list[dict]:
    """[{"id", "prompt", "text"}]: each prompt's continuation or answer; every prompt checked before the first runs."""
    sampling.check()
    encode = encoder(tok, info)
    encoded = [encode([{"role": "user", "content": p}]) for p in prompts]
    for k, ids in enumerate(encoded):
        check_fits(model, int(ids["input_ids"].shape[1]), sampling, f"prompt {k + 1}")
    return [{"id": k, "prompt": p, "text": generate(model, tok, ids, sampling)}
            for k, (p, ids) in enumerate(zip(prompts, encoded))]


def prompt_messages(text: str, conversational: bool) -> list[dict]:
    """A row's text as the messages to answer: a conversation up to its last user message, else one user message."""
    if not conversational:
        return [{"role": "user", "content": text}]
    from pipeline.data.io import conversation

    messages = conversation.decode(text)
    last = max((k for k, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    return messages[: last + 1]


def perplexity(model: Any, tok: Any, info: dict, text: str, conversational: bool) -> float | None:
    """exp of the mean next-token loss over a document's tokens (a conversation rendered by the chat template),
    cut to the model's positions; None for a document of one token (nothing to predict)."""
    import math

    import torch

    if conversational and info.get("template"):
        from pipeline.data.io import conversation

        text = tok.apply_chat_template(conversation.decode(text), tokenize=False)
    ids = tok(text, return_tensors="pt", truncation=bool(positions(model)), max_length=positions(model))["input_ids"]
    if ids.shape[1] < 2:
        return None
    with torch.inference_mode():
        return math.exp(float(model(input_ids=ids, labels=ids).loss))


def rows(model: Any, tok: Any, info: dict, texts: list[str], conversational: bool, sampling: Sampling,
         with_perplexity: bool) -> list[dict]:
    """Each document's generated continuation or answer ("text"), and its perplexity when asked."""
    encode, out = encoder(tok, info), []
    for k, text in enumerate(texts):
        ids = encode(prompt_messages(text, conversational))
        check_fits(model, int(ids["input_ids"].shape[1]), sampling, f"document {k + 1} of the part")
        row = {"text": generate(model, tok, ids, sampling)}
        if with_perplexity:
            row["perplexity"] = perplexity(model, tok, info, text, conversational)
        out.append(row)
    return out


def chat(model: Any, tok: Any, info: dict, sampling: Sampling, read: Callable[[str], str] = input,
         write: Callable[[str], None] = print) -> int:
    """An interactive conversation: each turn asked with every earlier one, through the run's chat template; the
    oldest turns are left out when the conversation outgrows the model's positions. Ctrl-D or Ctrl-C ends it (0)."""
    sampling.check()
    encode, messages = encoder(tok, info), []
    if not info.get("template"):
        print("note: this run has no chat template (not task=instruct): each line is continued as plain text",
              file=sys.stderr)
    limit = positions(model)
    while True:
        try:
            line = read("you> ")
        except (EOFError, KeyboardInterrupt):
            write("")
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        ids = encode(messages)
        while limit and ids["input_ids"].shape[1] + sampling.max_new_tokens > limit and len(messages) > 1:
            messages = messages[2:]  # the oldest question and its answer
            ids = encode(messages)
        try:
            check_fits(model, int(ids["input_ids"].shape[1]), sampling, "the message")
            text = generate(model, tok, ids, sampling).strip()
        except ValueError as e:
            write(f"error: {e}")
            messages.pop()
            continue
        except KeyboardInterrupt:
            write("")
            return 0
        messages.append({"role": "assistant", "content": text})
        write(f"assistant> {text}")
