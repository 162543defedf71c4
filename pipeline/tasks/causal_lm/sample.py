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


def samples(model: Any, tok: Any, cfg: Any, step: int) -> list[dict]:
    """Each prompt continued as plain text (the prompt and its continuation)."""
    return generate(model, tok, cfg, step, lambda t, prompt: t(prompt, return_tensors="pt"), answer_only=False)
