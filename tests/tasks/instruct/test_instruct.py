"""task=instruct: the loss is on the assistant's tokens only, through SmolLM2's own chat template and the plain
one; packing keeps every example whole and gives the unpacked loss; a masked token never reaches the loss."""

from __future__ import annotations

import random

import pytest
import torch

from pipeline.config import TokenizeConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.io import conversation
from pipeline.tasks.causal_lm import collate
from pipeline.tasks.instruct import stage, template
from tests.smollm2 import needs_smollm2

WORDS = [f"w{i}" for i in range(30)]


def _conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        turns = 2 if k % 3 else 4  # every third conversation has two assistant turns
        msgs = [{"role": "system", "content": "be brief"}] if k % 5 == 0 else []
        for t in range(turns):
            words = " ".join(rng.choices(WORDS, k=rng.randint(1, 9)))
            msgs.append({"role": "user" if t % 2 == 0 else "assistant", "content": words})
        out.append(msgs)
    return out


def _prepared(tmp_path, convs, tokenize: TokenizeConfig, block: int, packing: bool, kind: str = "auto"):
    from datasets import Dataset, DatasetDict

    texts = [conversation.encode(c) for c in convs]
    split = Dataset.from_dict({"id": [str(i) for i in range(len(texts))], "text": texts, "label": [""] * len(texts),
                               "chunk": [0] * len(texts)})
    out = tmp_path / f"{packing}-{block}"
    out.mkdir()
    result = stage.tokenize_conversations(DatasetDict({"train": split, "validation": split.select([]),
                                                       "test": split.select([])}),
                                          stage.InstructSection(tokenize, block, packing, kind),
                                          StageContext(out_dir=out, progress=False))
    return result, out / "tokenizer"


def _examples(row: dict) -> list[tuple[list[int], list[int]]]:
    """A row's examples: (ids, loss mask), cut where the positions restart."""
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
    return [(row["input_ids"][a:b], row["loss_mask"][a:b]) for a, b in zip(starts[:-1], starts[1:])]


BPE = TokenizeConfig(kind="bpe", vocab_size=300, min_frequency=0)


@pytest.mark.parametrize("packing", [True, False])
def test_the_plain_template_learns_each_answer_and_its_end_of_text_only(tmp_path, packing):
    from transformers import AutoTokenizer

    convs = _conversations(30)
    result, folder = _prepared(tmp_path, convs, BPE, 160, packing)
    assert result.stats["template"] == "plain" and (folder / "chat_template.jinja").read_text() == template.PLAIN
    tok = AutoTokenizer.from_pretrained(str(folder))
    examples = [e for row in result.data["train"] for e in _examples(row)]
    assert len(examples) == 30 and result.stats["train"]["truncated"] == 0
    assert (len(result.data["train"]) < 30) == packing and max(result.data["train"]["length"][:]) <= 160
    for (ids, mask), msgs in zip(examples, convs):
        assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)
        targets = tok.decode([i for i, m in zip(ids, mask) if m])
        assert targets == "".join(f" {m['content']}<|endoftext|>" for m in msgs if m["role"] == "assistant")
    assert result.data["train"]["bytes"][:] and sum(result.data["train"]["bytes"][:]) == sum(
        len(m["content"].encode()) for c in convs for m in c if m["role"] == "assistant")


@pytest.mark.slow  # the session's SmolLM2 conversion takes tens of seconds
@needs_smollm2
def test_smollm2s_chat_template_masks_its_system_prompt_and_the_user_turns(tmp_path, converted):
    from transformers import AutoTokenizer

    convs = _conversations(12, seed=1)
    result, folder = _prepared(tmp_path, convs, TokenizeConfig(kind="pretrained", pretrained=str(converted.folder)),
                               256, True)
    assert result.stats["template"] == "chat" and result.stats["eos_id"] == 2
    tok = AutoTokenizer.from_pretrained(str(folder))
    examples = [e for row in result.data["train"] for e in _examples(row)]
    for (ids, mask), msgs in zip(examples, convs):
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>system\n") and text == tok.apply_chat_template(msgs, tokenize=False)
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == "".join(
            f"{m['content']}<|im_end|>" for m in msgs if m["role"] == "assistant")


def test_an_example_longer_than_a_block_is_cut_and_counted_and_one_without_targets_dropped(tmp_path):
    long_answer = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": " ".join(WORDS * 3)}]
    long_prompt = [{"role": "user", "content": " ".join(WORDS * 3)}, {"role": "assistant", "content": "w2"}]
    short = [[{"role": "user", "content": "w3"}, {"role": "assistant", "content": "w4"}]] * 4
    result, _ = _prepared(tmp_path, [long_answer, long_prompt] + short, BPE, 32, True)
    assert result.stats["train"]["truncated"] == 1 and result.dropped == {"no_target_train": 1}
    assert result.stats["train"]["documents"] == 5 and max(result.data["train"]["length"][:]) <= 32


def _tiny_gpt2(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    conf = GPT2Config(vocab_size=vocab, n_positions=160, n_embd=32, n_layer=2, n_head=2, n_inner=64, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(conf).eval()


def test_packed_rows_give_the_unpacked_loss_and_a_masked_token_never_reaches_it(tmp_path):
    convs = _conversations(40, seed=2)
    packed, folder = _prepared(tmp_path, convs, BPE, 160, True)
    single, _ = _prepared(tmp_path, convs, BPE, 160, False)
    assert packed.stats["train"]["truncated"] == 0
    assert len(packed.data["train"]) < len(single.data["train"]) == 40
    model = _tiny_gpt2(packed.stats["vocab_size"] + 1)
    cols = ("input_ids", "position_ids", "loss_mask")
    sums = {}
    for name, result in (("packed", packed), ("single", single)):
        rows = [{c: r[c] for c in cols} for r in result.data["train"]]
        with torch.no_grad():
            losses = collate.row_losses(model, rows, 0, 8, torch.device("cpu"))
        sums[name] = losses.sum(0)
    assert sums["packed"][1] == sums["single"][1] == packed.stats["train"]["target_tokens"]
    assert torch.allclose(sums["packed"][0], sums["single"][0], rtol=1e-6)
    # the model's own loss over a padded batch is the mean over exactly the masked-in targets, and the gradient
    # of every logit that predicts a masked token (or padding, or another example's first token) is zero
    rows = [{c: r[c] for c in cols} for r in packed.data["train"]][:4]
    batch = collate.Collator(0)(rows)
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    logits = out.logits.detach().requires_grad_(True)
    targets = batch["input_ids"][:, 1:]
    keep = torch.zeros_like(targets, dtype=torch.bool)
    for i, r in enumerate(rows):
        m = torch.tensor(r["loss_mask"][1:], dtype=torch.bool)
        keep[i, :len(m)] = m & (torch.tensor(r["position_ids"][1:]) != 0)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    manual = torch.nn.functional.cross_entropy(out.logits[:, :-1][keep], targets[keep])
    assert torch.allclose(loss, manual) and torch.allclose(
        model(**batch).loss, manual, atol=1e-6)
    loss.backward()
    assert logits.grad[:, :-1][~keep].abs().max() == 0 and logits.grad[:, :-1][keep].abs().sum() > 0
    assert int(keep.sum()) == int(collate.loss_tokens(batch))
