"""CpuDropout (pipeline/training/dropout.py): nn.Dropout's distribution and scale, masks decided by torch's RNG
state (so resume and gradient checkpointing replay them), the gradient through the same mask, and the swap."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipeline.training.dropout import CpuDropout, keep_mask, use_cpu_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keeps_each_element_with_probability_one_minus_p_and_scales_as_nn_dropout(p):
    torch.manual_seed(0)
    drop = CpuDropout(p).train()
    x = torch.rand(1000, 1000) + 0.5  # no zeros: a zero in the output is a dropped element
    out = drop(x)
    kept = out != 0
    n = x.numel()
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(kept.sum().item() - n * (1 - p)) < 5 * sigma
    assert torch.equal(out[kept], (x * (1.0 / (1.0 - p)))[kept])
    assert torch.allclose(out[kept], x[kept] / (1 - p), rtol=1e-6)
    # no pattern across the tensor: rows and columns keep alike, neighbours independently
    rows, cols = kept.float().mean(1), kept.float().mean(0)
    assert rows.std().item() < 2 * math.sqrt(p * (1 - p) / 1000) and cols.std().item() < 2 * math.sqrt(p * (1 - p) / 1000)
    both = (kept[:, 1:] & kept[:, :-1]).float().mean().item()
    assert abs(both - (1 - p) ** 2) < 0.005


def test_torchs_rng_state_decides_the_mask():
    torch.manual_seed(3)
    state = torch.get_rng_state()
    a, b = keep_mask(torch.Size([64, 33, 384]), 0.1), keep_mask(torch.Size([64, 33, 384]), 0.1)
    assert not torch.equal(a, b)  # each call draws its own seed
    torch.set_rng_state(state)  # what a resume restores
    assert torch.equal(keep_mask(torch.Size([64, 33, 384]), 0.1), a)
    assert torch.equal(keep_mask(torch.Size([64, 33, 384]), 0.1), b)
    torch.manual_seed(4)
    assert not torch.equal(keep_mask(torch.Size([64, 33, 384]), 0.1), a)


def test_a_tiny_p_keeps_nearly_everything():
    """round((1 - p) * 2^32) is 2^32 for p below 2^-33, one past uint32: the threshold stops at 2^32 - 1."""
    torch.manual_seed(0)
    assert keep_mask(torch.Size([1000, 1000]), 1e-12).all()


def test_the_gradient_goes_through_the_same_mask_with_the_same_scale():
    torch.manual_seed(0)
    x = (torch.rand(32, 33, 384) + 0.5).requires_grad_()
    out = CpuDropout(0.2).train()(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    kept = out.detach() != 0
    assert torch.equal(x.grad, torch.where(kept, grad * (1.0 / 0.8), 0.0))


def test_bf16_input_keeps_its_dtype():
    torch.manual_seed(0)
    x = torch.rand(16, 384, dtype=torch.bfloat16) + 0.5
    out = CpuDropout(0.1).train()(x)
    assert out.dtype == torch.bfloat16
    kept = out != 0
    assert torch.equal(out[kept], (x * (1.0 / 0.9))[kept])


@pytest.mark.parametrize("setup", ["eval", "p0", "p1", "inplace"])
def test_where_it_is_plain_nn_dropout(setup):
    x = torch.rand(8, 16) + 0.5
    drop = CpuDropout(1.0 if setup == "p1" else 0.0 if setup == "p0" else 0.3, inplace=setup == "inplace")
    drop.train(setup != "eval")
    torch.manual_seed(1)
    ours = drop(x.clone())
    torch.manual_seed(1)
    theirs = nn.Dropout(drop.p, inplace=drop.inplace).train(setup != "eval")(x.clone())
    assert torch.equal(ours, theirs)


def test_use_cpu_dropout_changes_plain_dropouts_only_and_keeps_the_state_dict():
    class Own(nn.Dropout):
        pass

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.2), Own(0.3)), nn.Identity())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_cpu_dropout(model) == 2
    assert [type(m) for m in model.modules()][1:] == [nn.Linear, CpuDropout, nn.Sequential, CpuDropout, Own,
                                                       nn.Identity]
    assert model[1].p == 0.1 and model[2][0].p == 0.2
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert use_cpu_dropout(model) == 0  # already changed


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    conf = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0,
                      num_labels=2)
    model = BertForSequenceClassification(conf).train()
    assert use_cpu_dropout(model) == 8  # embeddings, 3 a layer (attention's too), the classifier's
    return model


def _grads(model, checkpointing: bool) -> dict:
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(7)
    ids = torch.randint(1, 100, (4, 12))
    model(input_ids=ids, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_checkpointing_replays_the_same_masks():
    """A checkpointed layer runs again in backward with the RNG state it first ran with: the same masks, so the
    same gradients as without checkpointing (a different mask would change them all)."""
    plain, checkpointed = _grads(_tiny_bert(), False), _grads(_tiny_bert(), True)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_the_training_loop_trains_a_cpu_run_with_it(prepared, fresh_accelerate, monkeypatch):
    """train() changes the model's dropouts on a CPU: every nn.Dropout of the toy BERT (embeddings, 3 a layer,
    the classifier's) before the first step."""
    from pipeline.checks import load_config
    from pipeline.training import dropout, signals
    from pipeline.training.loop import train

    changed = []
    real = dropout.use_cpu_dropout
    monkeypatch.setattr(dropout, "use_cpu_dropout", lambda model: changed.append(real(model)) or changed[-1])
    config = prepared(train={"max_steps": 2, "save_every": 0})
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    assert changed == [8]
