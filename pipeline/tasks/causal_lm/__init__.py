"""Causal language modelling: documents packed into blocks (pack.py) for a GPT-2 built from the config or any
AutoModelForCausalLM; the loss of an optimizer step is the mean over all its target tokens; validation and
evaluation report perplexity and bits per byte over the whole split."""

from __future__ import annotations

from pipeline.data.engines.base import Stage
from pipeline.task import Task
from pipeline.tasks.causal_lm import collate, loss, model, pack, sample, score

METRICS = {"perplexity": False, "bits_per_byte": False, "loss": False}  # lower is better, all three


def stages(cfg, tokenize: Stage) -> list[Stage]:
    """One stage after split: tokenize (the shared tokenizer settings) and pack (lm.*)."""
    return [Stage("tokenize", pack.tokenize_and_pack, pack.PackSection.of(tokenize.section, cfg.lm))]


def data_info(manifests: dict) -> dict:
    stats = manifests["tokenize"]["stats"]
    return {"block_size": stats["block_size"], "boundaries": stats["boundaries"], "eos_id": stats["eos_id"],
            "documents": {s: stats[s]["documents"] for s in ("train", "validation", "test")}}


def validate(cfg) -> None:
    if cfg.train.metric_for_best not in METRICS:
        raise ValueError(f"train.metric_for_best: {cfg.train.metric_for_best!r} is not one of "
                         f"{', '.join(map(repr, METRICS))} (the causal_lm task's metrics)")
    if cfg.tokenize.kind == "wordpiece":
        raise ValueError("tokenize.kind=wordpiece: task=causal_lm needs an end-of-text token between documents; use "
                         "bpe (trained on train) or pretrained")
    if cfg.eval.runtime != "torch" or cfg.eval.precision == "int8":
        raise ValueError(f"eval.runtime={cfg.eval.runtime}, eval.precision={cfg.eval.precision}: task=causal_lm "
                         f"evaluates with eval.runtime=torch at fp32 or bf16")


def check_model(model, info: dict, ckpt) -> None:
    """Nothing of its own: the shared checks cover a language model (its vocabulary, and positions for
    blocks of lm.block_size: build.check_fit with prepared.longest_example)."""


def card_data(manifests: dict) -> list[str]:
    """The model card's line for the tokenize stage: train tokens in blocks (task=instruct: its template and the
    answer tokens the loss is on)."""
    st = manifests.get("tokenize", {}).get("stats", {})
    if "block_size" not in st:
        return []
    template = (f", the {st['template']} template, loss on {st['train']['target_tokens']:,} answer tokens"
                if "template" in st else "")
    return [f"- **Tokens**: {st.get('kind')} tokenizer, {st['train'].get('tokens', 0):,} train tokens in blocks of "
            f"{st['block_size']}{template}."]


def max_tokens(cfg, info: dict) -> int:
    """An example is a block: lm.block_size as the prepared data recorded it."""
    return info["block_size"]


def card_metrics(metrics: dict) -> list[tuple[str, str, float]]:
    """A model card's figures: perplexity per token, and bits per byte (comparable across tokenizers)."""
    m = metrics["lm"]
    return [("perplexity", "Perplexity", m["perplexity"]), ("bits_per_byte", "Bits per byte", m["bits_per_byte"])]


TASK = Task(
    name="causal_lm",
    stages=stages,
    data_info=data_info,
    validate=validate,
    columns=("position_ids", "bytes"),
    metrics=METRICS,
    collator=collate.Collator,
    build_model=model.build_model,
    model_class=model.model_class,
    score=score.score_rows,
    check_model=check_model,
    evaluate=score.evaluate,
    write_report=score.write_report,
    summary=score.summary,
    outputs=collate.row_losses,
    loss_tokens=collate.loss_tokens,
    weighted_loss=collate.smoothed_loss,
    training_loss=loss.training_loss,
    samples=sample.samples,
    check_settings=sample.check,
    peft_task_type="CAUSAL_LM",
    pipeline_tag="text-generation",
    model_kind="causal language model",
    card_data=card_data,
    card_metrics=card_metrics,
    sections=("lm",),
    max_tokens=max_tokens,
    max_tokens_setting="lm.block_size",
    output_width=2,  # row_losses: summed loss and target count
)
