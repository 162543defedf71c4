"""The language model: any AutoModelForCausalLM (a hub name, a folder, a packaged GGUF file), or a GPT-2
built from the config (model.from_scratch=gpt2) with the prepared tokenizer's vocabulary."""

from __future__ import annotations

from pipeline.models import lora
from pipeline.models.pretrained import load_pretrained, resolve_pretrained


def build_model(cfg, tok, info: dict):
    """The model to train. Its config says use_cache=False: transformers builds the block-diagonal mask of
    packed documents only when no key/value cache is made (generate still caches: generation_config). A GPT-2 from
    the config computes GPT-2's GELU (the tanh approximation) with torch's one fused kernel, gelu_pytorch_tanh,
    not gelu_new's eight elementwise operations: the same function to float rounding (4.8e-7 apart at most), its
    forward and backward fewer passes over the (batch, block, 4 x hidden) activations."""
    from transformers import AutoModelForCausalLM, GPT2Config

    m = cfg.model
    if not m.from_scratch:
        model = load_pretrained(AutoModelForCausalLM, resolve_pretrained(m.name_or_path), **lora.load_kwargs(cfg))
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        model.config.use_cache = False
        return model
    if m.from_scratch != "gpt2":
        raise ValueError(f"model.from_scratch={m.from_scratch!r}: task=causal_lm builds gpt2 (bert is not a causal LM)")
    positions = -(-max(cfg.lm.block_size, 8) // 8) * 8
    eos = tok.eos_token_id
    conf = GPT2Config(
        vocab_size=len(tok), n_positions=positions, n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_heads,
        n_inner=m.intermediate_size, resid_pdrop=m.dropout, embd_pdrop=m.dropout,
        attn_pdrop=m.dropout if m.attention_dropout < 0 else m.attention_dropout,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos, bos_token_id=eos, eos_token_id=eos,
        use_cache=False, activation_function="gelu_pytorch_tanh",
    )
    return AutoModelForCausalLM.from_config(conf)


def model_class():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM
