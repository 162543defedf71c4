"""task=instruct's tokenize stage: each conversation rendered with the chat template and tokenized whole
(template.py), cut to lm.block_size tokens where longer (counted), and laid into rows: packed (several
examples a row, positions restarting at each, so that transformers' packed-sequence mask keeps attention
inside an example, as causal_lm's blocks do) or one example a row.

Each row holds input_ids, position_ids, loss_mask (1 on the assistant's tokens), length, and bytes (the
UTF-8 bytes of the assistant text it holds: bits per byte of the answers).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, TEXT, column
from pipeline.data.io import conversation
from pipeline.data.stages.tokenize import build_tokenizer
from pipeline.schema import LMConfig, TokenizeConfig
from pipeline.tasks.instruct import template


@dataclass(frozen=True)
class InstructSection:
    """The stage's settings and so its fingerprint: the tokenizer's and the lm keys that shape the rows."""

    tokenize: TokenizeConfig
    block_size: int
    packing: bool
    template: str

    @classmethod
    def of(cls, tokenize: TokenizeConfig, lm: LMConfig) -> "InstructSection":
        return cls(tokenize, lm.block_size, lm.packing, lm.template)


def rows_of(examples: list[template.Example], block: int, packing: bool) -> dict[str, list]:
    """The split's columns from its examples."""
    out = {"input_ids": [], "position_ids": [], "loss_mask": [], "length": [], "bytes": []}
    for row in template.pack(examples, block, packing):
        out["input_ids"].append([i for e in row for i in e.ids])
        out["position_ids"].append([p for e in row for p in range(len(e.ids))])
        out["loss_mask"].append([m for e in row for m in e.targets])
        out["length"].append(sum(len(e.ids) for e in row))
        out["bytes"].append(sum(e.target_bytes for e in row))
    return out


def tokenize_conversations(dd, section: InstructSection, ctx: StageContext) -> StageResult:
    """DatasetDict of conversations -> DatasetDict of rows; the tokenizer (with its chat template) saved alongside."""
    from datasets import Dataset, DatasetDict, Features, List, Value

    cfg = section.tokenize
    folder = ctx.out_dir / "tokenizer"
    train_texts = [conversation.plain(t) for t in column(dd["train"], TEXT)] if cfg.kind != "pretrained" else []
    tok = build_tokenizer(train_texts, cfg, cfg.pretrained, folder)
    tok.no_truncation()  # an example is cut to block_size here, counted, never by the tokenizer
    tok.save(str(folder / "tokenizer.json"))
    used = template.set_template(folder, section.template)
    renderer = template.Renderer(folder, tok)
    features = Features({"input_ids": List(Value("int32")), "position_ids": List(Value("int32")),
                         "loss_mask": List(Value("int8")), "length": Value("int64"), "bytes": Value("int64")})
    eos = renderer.hf.eos_token_id
    stats = {"kind": cfg.kind, "vocab_size": tok.get_vocab_size(), "block_size": section.block_size,
             "boundaries": "document", "eos_id": eos, "template": used, "packing": section.packing}
    result, dropped = {}, {}
    for s in SPLITS:
        examples = renderer.examples([conversation.decode(t) for t in column(dd[s], TEXT)], section.block_size)
        kept = [e for e in examples if any(e.targets)]  # a prompt longer than a block leaves nothing to learn
        if len(kept) < len(examples):
            dropped[f"no_target_{s}"] = len(examples) - len(kept)
        cols = rows_of(kept, section.block_size, section.packing)
        result[s] = Dataset.from_dict(cols, features=features)
        tokens = sum(cols["length"])
        stats[s] = {"documents": len(kept), "tokens": tokens, "target_tokens": sum(sum(e.targets) for e in kept),
                    "rows": len(cols["length"]), "bytes": sum(cols["bytes"]),
                    "truncated": sum(e.truncated for e in kept),
                    "fill": round(tokens / (len(cols["length"]) * section.block_size), 4) if cols["length"] else 0.0}
    return StageResult(DatasetDict(result), dropped, stats)
