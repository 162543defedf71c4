"""The causal_lm task's tokenize stage: whole documents tokenized (never truncated), an end-of-text token
after each, packed into blocks of `lm.block_size` tokens with no padding but the last block's.

Each block row holds `input_ids` and `position_ids`. With lm.boundaries=document the positions restart at
every document's first token; transformers then builds a block-diagonal causal mask from them (packed
sequences: `masking_utils.find_packed_sequence_indices`, used when no attention mask is given), so no
token attends to another document's and each document is scored as if it were alone. With `none` the
positions run 0..block_size-1 (concatenate-and-chunk, as transformers' run_clm). A document longer than
a block continues in the next one with its positions restarted (a block is one model call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, TEXT, column
from pipeline.data.stages.tokenize import build_tokenizer
from pipeline.schema import LMConfig, TokenizeConfig


@dataclass(frozen=True)
class PackSection:
    """The stage's settings, and so its fingerprint: the tokenizer's (the shared tokenize section) and the two
    lm keys that decide the blocks (lm's sampling keys do not: changing a prompt prepares nothing again)."""

    tokenize: TokenizeConfig
    block_size: int
    boundaries: str

    @classmethod
    def of(cls, tokenize: TokenizeConfig, lm: LMConfig) -> "PackSection":
        return cls(tokenize, lm.block_size, lm.boundaries)


def eos_id(tok: Any, folder) -> int:
    """The end-of-text id: the tokenizer folder's eos_token (a trained BPE's <|endoftext|>)."""
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")) \
        if (folder / "tokenizer_config.json").is_file() else {}
    name = config.get("eos_token")
    name = name.get("content") if isinstance(name, dict) else name
    found = tok.token_to_id(name) if name else None
    if found is None:
        raise ValueError(f"tokenize: the tokenizer in {folder} has no eos_token (tokenizer_config.json); task=causal_lm "
                         f"puts one after every document")
    return found


def block_bytes(docs: list[list[int]], doc_bytes: list[int], block: int) -> list[int]:
    """Each block's share of the split's UTF-8 bytes: a document's bytes go to the block holding its end-of-text
    token, so a split's blocks add up to its bytes (the denominator of bits per byte)."""
    out = [0] * max(1, -(-sum(len(d) + 1 for d in docs) // block))
    end = 0
    for doc, n in zip(docs, doc_bytes):
        end += len(doc) + 1
        out[(end - 1) // block] += n
    return out if docs else []


def pack_ids(docs: list[list[int]], eos: int, block: int, restart: bool) -> tuple[list[list[int]], list[list[int]]]:
    """(blocks of token ids, their position ids): each document's ids and `eos` laid end to end and cut every
    `block` tokens; positions restart at each document's first token (and at each block) when `restart`."""
    ids: list[int] = []
    pos: list[int] = []
    for doc in docs:
        ids += doc
        ids.append(eos)
        pos += range(len(doc) + 1)
    blocks = [ids[i:i + block] for i in range(0, len(ids), block)]
    if not restart:
        return blocks, [list(range(len(b))) for b in blocks]
    positions = []
    for i in range(0, len(pos), block):
        p = pos[i:i + block]
        first = p[0]  # a document continued from the block before restarts at 0 here
        out, offset = [], first
        for x in p:
            if x == 0:
                offset = 0
            out.append(x - offset)
        positions.append(out)
    return blocks, positions


def tokenize_and_pack(dd, section: PackSection, ctx: StageContext) -> StageResult:
    """DatasetDict of documents -> DatasetDict of blocks (input_ids, position_ids, length); the tokenizer
    saved alongside, as the shared tokenize stage saves it."""
    from datasets import Dataset, DatasetDict, Features, List, Value

    cfg = section.tokenize
    train_texts = column(dd["train"], TEXT) if cfg.kind != "pretrained" else []
    folder = ctx.out_dir / "tokenizer"
    tok = build_tokenizer(train_texts, cfg, cfg.pretrained, folder)
    tok.no_truncation()  # whole documents: a block is cut by packing, never a document by the tokenizer
    tok.save(str(folder / "tokenizer.json"))
    eos = eos_id(tok, folder)
    features = Features({"input_ids": List(Value("int32")), "position_ids": List(Value("int32")),
                         "length": Value("int64"), "bytes": Value("int64")})
    result, stats = {}, {"kind": cfg.kind, "vocab_size": tok.get_vocab_size(), "block_size": section.block_size,
                         "boundaries": section.boundaries, "eos_id": eos}
    for s in SPLITS:
        texts = column(dd[s], TEXT)
        docs = [e.ids for e in tok.encode_batch(texts)] if texts else []
        doc_bytes = [len(t.encode("utf-8")) for t in texts]
        blocks, positions = pack_ids(docs, eos, section.block_size, section.boundaries == "document")
        result[s] = Dataset.from_dict({"input_ids": blocks, "position_ids": positions, "length": [len(b) for b in blocks],
                                       "bytes": block_bytes(docs, doc_bytes, section.block_size)}, features=features)
        stats[s] = {"documents": len(docs), "tokens": sum(len(d) + 1 for d in docs), "blocks": len(blocks),
                    "bytes": sum(doc_bytes)}
    return StageResult(DatasetDict(result), {}, stats)
