"""A task that lives only in the tests: token tagging (AutoModelForTokenClassification), made of nothing but the
Task contract (pipeline/task.py) and the shared modules a task may import, to prove that a task is its folder and
one registry line (test_tagging.py registers it from the test).

It differs from every packaged task where the shared code used to assume a classifier or a language model: its
own stage after split (tokenizer and tags in one pass), one target per token, a model class no packaged task
uses, per-row outputs of three columns, and its own metrics, report and card lines. Each word is tagged CUE
when it is one of the toy corpus's sentiment cues (tests/training/trainkit.py), else O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.data.engines.base import Stage, StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, TEXT, column
from pipeline.data.stages.tokenize import build_tokenizer
from pipeline.inference.padding import pad
from pipeline.schema import TokenizeConfig
from pipeline.task import Task
from tests.training.trainkit import CUES

TAGS = ["O", "CUE"]
CUE_WORDS = frozenset(word for words in CUES.values() for word in words)
IGNORE = -100  # special tokens carry no tag
METRICS = {"token_accuracy": True, "loss": False}


@dataclass(frozen=True)
class TagSection:
    """The stage's settings (its fingerprint): the shared tokenize section, nothing of its own."""

    tokenize: TokenizeConfig


def tag(dd, section: TagSection, ctx: StageContext) -> StageResult:
    """DatasetDict of texts -> input_ids, length and tags (a word's tag on each of its tokens); the tokenizer saved
    in the stage folder, as the shared tokenize stage saves it."""
    from datasets import Dataset, DatasetDict, Features, List, Value

    cfg = section.tokenize
    tok = build_tokenizer(column(dd["train"], TEXT), cfg, cfg.pretrained, ctx.out_dir / "tokenizer")
    features = Features({"id": Value("string"), "input_ids": List(Value("int32")), "length": Value("int64"),
                         "tags": List(Value("int8"))})
    result, stats = {}, {"tags": {}}
    for s in SPLITS:
        texts = column(dd[s], TEXT)
        encoded = tok.encode_batch(texts) if texts else []
        tags = [[IGNORE if w is None else int(text.split()[w] in CUE_WORDS) for w in e.word_ids]
                for text, e in zip(texts, encoded)]
        result[s] = Dataset.from_dict({"id": column(dd[s], "id"), "input_ids": [e.ids for e in encoded],
                                       "length": [len(e.ids) for e in encoded], "tags": tags}, features=features)
        stats["tags"][s] = sum(t == 1 for row in tags for t in row)
    return StageResult(DatasetDict(result), {}, stats)


class Collator:
    """input_ids and attention_mask padded (the shared `pad`), the tags padded with IGNORE as `labels`."""

    def __init__(self, pad_id: int, multiple: int = 0, max_length: int = 0):
        self.pad_id, self.multiple, self.max_length = pad_id, multiple, max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = pad([r["input_ids"] for r in rows], self.pad_id, self.multiple, self.max_length)
        labels = torch.full(batch["input_ids"].shape, IGNORE, dtype=torch.long)
        for i, r in enumerate(rows):
            labels[i, : len(r["tags"])] = torch.as_tensor(r["tags"], dtype=torch.long)
        return {**batch, "labels": labels}


def outputs(model: Any, rows: list[dict], pad_id: int, multiple: int, device: Any) -> Any:
    """(rows, 3): each row's summed token loss (nats), its tagged tokens and how many of them the model gets right."""
    import torch

    batch = {k: v.to(device) for k, v in Collator(pad_id, multiple)(rows).items()}
    labels = batch.pop("labels")
    logits = model(**batch).logits.float()  # (rows, seq, tags)
    keep = labels != IGNORE
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
    right = (logits.argmax(-1) == labels) & keep
    return torch.stack([(nll * keep).sum(1, dtype=torch.float64), keep.sum(1).double(), right.sum(1).double()], 1)


def score(out, ds, info: dict) -> dict:
    """Token accuracy and mean loss over every tagged token of the split."""
    loss, tokens, right = (float(x) for x in out.sum(0))
    return {"loss": loss / max(tokens, 1), "token_accuracy": right / max(tokens, 1), "examples": len(out)}


def build_model(cfg, tok, info: dict):
    from transformers import AutoModelForTokenClassification, BertConfig

    m = cfg.model
    conf = BertConfig(vocab_size=len(tok), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                      num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
                      max_position_embeddings=cfg.tokenize.max_length, pad_token_id=tok.pad_token_id,
                      num_labels=len(info["tags"]), id2label=dict(enumerate(info["tags"])))
    return AutoModelForTokenClassification.from_config(conf)


def model_class():
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification


def validate(cfg) -> None:
    if cfg.train.metric_for_best not in METRICS:
        raise ValueError(f"train.metric_for_best: {cfg.train.metric_for_best!r} is not one of {', '.join(METRICS)}")


def check_model(model: Any, info: dict, ckpt) -> None:
    if model.config.num_labels != len(info["tags"]):
        raise ValueError(f"{ckpt} tags {model.config.num_labels} classes, the data {len(info['tags'])}")


def write_report(folder, metrics: dict, out, ds, eval_cfg) -> None:
    rows = [{"id": i, "tokens": int(n), "right": int(r)} for i, (_, n, r) in zip(ds["id"][:], out)]
    (folder / "tokens.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


TASK = Task(
    name="tagging",
    stages=lambda cfg, tokenize: [Stage("tag", tag, TagSection(tokenize.section))],
    data_info=lambda manifests: {"tags": TAGS},
    validate=validate,
    columns=("tags",),
    metrics=METRICS,
    collator=Collator,
    build_model=build_model,
    model_class=model_class,
    score=score,
    check_model=check_model,
    evaluate=lambda out, ds, info: {"tags": info["tags"], "token": score(out, ds, info)},
    write_report=write_report,
    summary=lambda metrics: f"token accuracy {metrics['token']['token_accuracy']:.4f}",
    outputs=outputs,
    output_width=3,
    pipeline_tag="token-classification",
    model_kind="token tagger",
    card_data=lambda manifests: [f"- **Cue tokens in train**: {manifests['tag']['stats']['tags']['train']:,}."],
    card_metrics=lambda metrics: [("accuracy", "Token accuracy", metrics["token"]["token_accuracy"])],
)
