"""Packing documents into blocks, and what the model sees of them: no token attends to another document's."""

import math

import numpy as np
import pytest
import torch

from pipeline.tasks.causal_lm.collate import IGNORE, Collator, loss_tokens, row_losses
from pipeline.tasks.causal_lm.pack import block_bytes, pack_ids
from pipeline.tasks.causal_lm.score import lm_metrics

DOCS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
EOS = 1


def test_documents_are_laid_end_to_end_with_eos_and_positions_restart_at_each():
    blocks, pos = pack_ids(DOCS, EOS, 4, restart=True)
    assert blocks == [[5, 6, 7, 1], [8, 9, 1, 10], [11, 12, 13, 14], [1]]
    assert pos == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 2, 3], [0]]  # a document continued in a block restarts at 0


def test_concatenation_keeps_positions_running_within_a_block():
    blocks, pos = pack_ids(DOCS, EOS, 4, restart=False)
    assert blocks == [[5, 6, 7, 1], [8, 9, 1, 10], [11, 12, 13, 14], [1]]
    assert pos == [[0, 1, 2, 3]] * 3 + [[0]]


def test_each_document_s_bytes_go_to_the_block_of_its_end_so_a_split_adds_up():
    assert block_bytes(DOCS, [30, 20, 50], 4) == [30, 20, 0, 50]
    assert block_bytes([], [], 4) == []


def test_labels_skip_each_segment_s_first_token_and_padding():
    rows = [{"input_ids": [8, 9, 1, 10], "position_ids": [0, 1, 2, 0]}, {"input_ids": [1], "position_ids": [0]}]
    batch = Collator(pad_id=3)(rows)
    assert batch["input_ids"].tolist() == [[8, 9, 1, 10], [1, 3, 3, 3]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 2]]
    assert batch["labels"].tolist() == [[IGNORE, 9, 1, IGNORE], [IGNORE] * 4]
    assert "attention_mask" not in batch  # a mask would turn off transformers' packed-sequence masking
    assert int(loss_tokens(batch)) == 2


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    conf = GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, use_cache=False)  # as build_model makes it: a cache turns packed masking off
    return GPT2LMHeadModel(conf).eval()


def _alone(model, doc: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([doc + [EOS]])).logits[0]


def _model(kind: str, attention: str):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "gpt2":
        conf = GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        return GPT2LMHeadModel._from_config(conf, attn_implementation=attention).eval()
    conf = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=32, use_cache=False)  # SmolLM2's architecture
    return LlamaForCausalLM._from_config(conf, attn_implementation=attention).eval()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_documents_logits_packed_among_others_equal_its_logits_alone(kind, attention):
    model = _model(kind, attention)
    docs = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    blocks, pos = pack_ids(docs, EOS, 32, restart=True)
    batch = Collator(pad_id=0)([{"input_ids": blocks[0], "position_ids": pos[0]}] * 2)  # a batch of two
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[1]
    start = 0
    for doc in docs:
        alone = _alone(model, doc)
        assert torch.allclose(packed[start:start + len(doc) + 1], alone, atol=1e-5), doc
        start += len(doc) + 1


def test_plain_concatenation_lets_later_documents_see_earlier_ones(gpt2):
    """The control: without restarted positions the second document's logits are not its logits alone."""
    docs = [[5, 6, 7, 8, 9], [10, 11, 12]]
    blocks, pos = pack_ids(docs, EOS, 32, restart=False)
    with torch.no_grad():
        packed = gpt2(input_ids=torch.tensor(blocks), position_ids=torch.tensor(pos)).logits[0]
    assert not torch.allclose(packed[6:10], _alone(gpt2, docs[1]), atol=1e-3)


def test_perplexity_and_bits_per_byte_are_the_whole_splits_token_weighted_values(gpt2):
    """Against a hand computation: log-softmax of each target, summed over the split, divided once."""
    rows = [{"input_ids": [5, 6, 7, 1, 8, 9], "position_ids": [0, 1, 2, 3, 0, 1]},
            {"input_ids": [10, 11, 12], "position_ids": [0, 1, 2]}]
    out = row_losses(gpt2, rows, 0, 8, torch.device("cpu")).numpy()
    nll, count = 0.0, 0
    for r in rows:
        with torch.no_grad():
            logp = torch.log_softmax(gpt2(input_ids=torch.tensor([r["input_ids"]]),
                                          position_ids=torch.tensor([r["position_ids"]])).logits[0].double(), -1)
        for t in range(1, len(r["input_ids"])):
            if r["position_ids"][t] != 0:
                nll -= float(logp[t - 1, r["input_ids"][t]])
                count += 1
    assert count == 6 and out[:, 1].tolist() == [4.0, 2.0]  # 5 targets less one document start; 2
    m = lm_metrics(out, [11, 7])
    assert m["tokens"] == 6 and m["bytes"] == 18 and m["blocks"] == 2
    assert m["loss"] == pytest.approx(nll / 6, rel=1e-6)
    assert m["perplexity"] == pytest.approx(math.exp(nll / 6), rel=1e-6)
    assert m["bits_per_byte"] == pytest.approx(nll / math.log(2) / 18, rel=1e-6)
    batch_means = np.mean(out[:, 0] / out[:, 1])  # what a mean of batch means would give instead
    assert abs(batch_means - m["loss"]) > 1e-4
