"""Text sampled from fixed prompts (lm.prompts) before training, at each validation and by evaluate.py: what
the loss does not show. Sampling runs under its own seed inside torch.random.fork_rng, so it never moves the
training RNG (a resumed run equals one that never stopped, whether or not it sampled)."""

from __future__ import annotations

from typing import Any, Callable


def generate(model: Any, tok: Any, cfg: Any, step: int, encode: Callable, answer_only: bool) -> list[dict]:
    """[{"step", "prompt", "text"}] for each of cfg.lm.prompts, encoded by `encode(tok, prompt)` (a dict of
    model inputs): cfg.lm.sample_tokens new tokens at cfg.lm.sample_temperature (0: greedy), seeded by
    train.seed, stopping at the tokenizer's end token; the text is the whole sequence, or the new tokens alone."""
    import torch

    lm = cfg.lm
    if not lm.prompts or lm.sample_tokens == 0:
        return []
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(cfg.train.seed)
            for prompt in lm.prompts:
                ids = encode(tok, prompt).to(device)
                greedy = lm.sample_temperature == 0
                sampling = {} if greedy else {"temperature": lm.sample_temperature, "top_k": 0, "top_p": 1.0}
                gen = model.generate(**ids, max_new_tokens=lm.sample_tokens, do_sample=not greedy, use_cache=True,
                                     pad_token_id=model.config.pad_token_id, **sampling,
                                     **({"eos_token_id": tok.eos_token_id} if answer_only else {}))
                start = ids["input_ids"].shape[1] if answer_only else 0
                text = tok.decode(gen[0, start:], skip_special_tokens=True)
                out.append({"step": step, "prompt": prompt, "text": text.strip() if answer_only else text})
    finally:
        model.train(was_training)
    return out


def check_prompts(model: Any, tok: Any, cfg: Any, encode: Callable) -> None:
    """Before any file is written (train.py and evaluate.py): each of lm.prompts encodes to at least one token, and
    with lm.sample_tokens new ones fits the model's positions. Otherwise the first sample, at step 0, failed deep in
    generate() with an IndexError, after the run folder was made."""
    lm = cfg.lm
    if not lm.prompts or lm.sample_tokens == 0:
        return
    conf = model.config
    positions = getattr(conf, "max_position_embeddings", None) or getattr(conf, "n_positions", None)
    for k, prompt in enumerate(lm.prompts):
        n = int(encode(tok, prompt)["input_ids"].shape[1])
        if n == 0:
            raise ValueError(f"lm.prompts[{k}] is {prompt!r}, which encodes to no token: a sample continues its prompt; "
                             f"give it some text, or set lm.prompts=[] to sample nothing")
        if positions and n >= positions:
            raise ValueError(f"lm.prompts[{k}] is {n} tokens, and the model has {positions} positions: shorten it")
        if positions and n + lm.sample_tokens > positions:
            raise ValueError(f"lm.prompts[{k}] ({n} tokens) and lm.sample_tokens={lm.sample_tokens} need {n + lm.sample_tokens} "
                             f"positions, and the model has {positions}: set lm.sample_tokens to {positions - n} or less, "
                             f"or shorten the prompt")


def _plain(tok: Any, prompt: str) -> Any:
    return tok(prompt, return_tensors="pt")


def samples(model: Any, tok: Any, cfg: Any, step: int) -> list[dict]:
    """Each prompt continued as plain text (the prompt and its continuation)."""
    return generate(model, tok, cfg, step, _plain, answer_only=False)


def check(model: Any, tok: Any, cfg: Any) -> None:
    check_prompts(model, tok, cfg, _plain)
