"""causal_lm's fused output layer and cross-entropy (pipeline/tasks/causal_lm/loss.py): the model's own loss and
gradients to float rounding, smoothing included, over several chunks; refused where the model transforms its logits."""

from __future__ import annotations

import pytest
import torch

from pipeline.tasks.causal_lm import collate, loss
from pipeline.tasks.causal_lm.collate import IGNORE


def _gpt2(**kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=32, n_embd=16, n_layer=2, n_head=2, use_cache=False,
                                      **kw))


def _llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
                                        use_cache=False))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 20), generator=g)
    pos = torch.cat([torch.arange(12), torch.arange(8)]).expand(3, 20)  # two packed documents a row
    labels = ids.masked_fill((pos == 0) | (torch.rand(3, 20, generator=g) < 0.2), IGNORE)
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def _grads(model, run):
    model.zero_grad(set_to_none=True)
    value = run()
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", [_gpt2, lambda: _llama(True), lambda: _llama(False)], ids=["gpt2", "llama-tied",
                                                                                             "llama-untied"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_fused_loss_and_its_gradients_are_the_models_own_over_several_chunks(make, smoothing, monkeypatch):
    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 97 * 7)  # chunks of 7 positions: 9 for the batch's 60
    model = make()
    fn = loss.training_loss(model)
    assert fn is not None
    model.eval()  # no dropout: both sides see the same activations
    batch = _batch()
    if smoothing:
        def own():
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            return collate.smoothed_loss(model(**inputs).logits, batch["labels"], None, smoothing)
    else:
        def own():
            return model(**batch).loss
    want, want_grads = _grads(model, own)
    got, got_grads = _grads(model, lambda: fn(model, batch, smoothing))
    assert got.item() == pytest.approx(want.item(), abs=1e-5)
    assert want_grads.keys() == got_grads.keys()
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_several_chunks_give_the_one_chunk_loss_and_bf16_autocast_stays_near_the_models_own(monkeypatch):
    model = _gpt2().eval()
    batch = _batch()
    hidden = model(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True).hidden_states[-1]
    whole = loss.fused_loss(hidden, model.lm_head.weight, batch["labels"])
    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 1)  # one position a chunk
    assert loss.fused_loss(hidden, model.lm_head.weight, batch["labels"]).item() == pytest.approx(whole.item(),
                                                                                                  abs=1e-6)
    fn = loss.training_loss(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own, fused = model(**batch).loss.float(), fn(model, batch)
    assert fused.dtype == torch.float32
    assert fused.item() == pytest.approx(own.item(), rel=2e-2)


def test_a_model_that_transforms_its_logits_keeps_its_own_loss():
    """A bias on the output layer, a logit scale the config names, or a forward that alters the logits in a way the
    checks do not know (the comparison with the model's own loss catches it): None, the model's own loss runs."""
    biased = _gpt2()
    biased.lm_head = torch.nn.Linear(16, 97, bias=True)
    assert loss.training_loss(biased) is None
    scaled = _gpt2()
    scaled.config.logit_scale = 0.5
    assert loss.training_loss(scaled) is None
    sneaky = _gpt2()
    forward = sneaky.lm_head.forward
    sneaky.lm_head.forward = lambda x: forward(x) * 2
    assert loss.training_loss(sneaky) is None
    model = _gpt2()
    model.train()
    assert loss.training_loss(model) is not None and model.training  # the check leaves the mode as it found it
