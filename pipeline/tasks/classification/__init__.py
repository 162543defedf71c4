"""Single-label text classification: a label stage maps raw labels to class ids before tokenize; the model
is AutoModelForSequenceClassification; validation and evaluation score logits of shape (n, num_labels)."""

from __future__ import annotations

from pipeline.data.engines.base import Stage
from pipeline.data.stages import tokenize as tokenize_stage
from pipeline.escape import markdown
from pipeline.task import Task
from pipeline.tasks.classification import aggregate, collate, evaluate, label, model, report, review, score

METRICS = {"accuracy": True, "macro_f1": True, "loss": False}  # metric_for_best: True where higher is better


def stages(cfg, tokenize: Stage) -> list[Stage]:
    # the review file's bytes are in the label stage's fingerprint: an edited file never reuses a stale cache
    uses = (review.fingerprint(cfg.label.review_file),) if cfg.label.review_file else ()
    return [Stage("label", label.label, cfg.label, uses=uses), tokenize]


def data_info(manifests: dict) -> dict:
    return {"label_names": manifests["label"]["stats"]["label_names"]}


def validate(cfg) -> None:
    """label.names and label.rules, and train.metric_for_best, checked before any data is read."""
    label.check_config(cfg.label)
    if cfg.train.metric_for_best not in METRICS:
        raise ValueError(f"train.metric_for_best: {cfg.train.metric_for_best!r} is not one of "
                         f"{', '.join(map(repr, METRICS))} (the classification task's metrics)")


def score_logits(logits, ds, info: dict) -> dict:
    """Every scalar validation metric (loss, accuracy, macro/micro F1, examples) of (n, num_labels) logits."""
    metrics = score.logit_metrics(logits, ds["label"][:], info["label_names"])
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def head(model) -> list[str]:
    """The classifier's new layers: the model's top-level modules with weights besides its pretrained body
    (BERT: classifier; DistilBERT: pre_classifier and classifier; GPT-2, Llama: score)."""
    return [n for n, m in model.named_children()
            if n != model.base_model_prefix and next(m.parameters(), None) is not None]


def card_data(manifests: dict) -> list[str]:
    """The model card's lines for the label and tokenize stages: the classes' counts in train, the tokens."""
    stats = manifests.get("label", {}).get("stats")
    counts = (stats or {}).get("class_counts", {}).get("train", {})
    lines = ["- **Classes in train**: " + ", ".join(f"{markdown(k)} {v:,}" for k, v in counts.items()) + "."] if stats else []
    reviewed = (stats or {}).get("review")
    if reviewed:
        lines.append(f"- **Reviewed labels** (label.review_file {markdown(reviewed['file'])}): {reviewed['relabeled']:,} "
                     f"document(s) relabelled, {reviewed['dropped']:,} dropped, {reviewed['unchanged']:,} confirmed.")
    return lines + ([tokenize_stage.card_line(manifests["tokenize"])] if "tokenize" in manifests else [])


def card_metrics(metrics: dict) -> list[tuple[str, str, float]]:
    """A model card's figures: document-level accuracy and macro F1 (a document's chunks vote)."""
    d = metrics["document"]
    return [("accuracy", "Accuracy", d["accuracy"]), ("f1", "Macro F1", d["macro_f1"])]


def margins(logits, labels):
    """(rows,) float32: the given label's logit minus the largest other, the margin of Pleiss et al. 2020 (AUM's
    summand); negative where the model ranks another class first. logits (rows, classes), labels (rows,) long."""
    z = logits.detach().float()
    given = z.gather(1, labels[:, None]).squeeze(1)
    others = z.scatter(1, labels[:, None], float("-inf"))
    return given - others.max(dim=1).values


def weighted_loss(logits, labels, weights, smoothing: float):
    """Cross-entropy with per-class weights and label smoothing (torch's definitions: the weighted mean over
    the micro-batch's rows), in float32."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), labels, weight=weights, label_smoothing=smoothing)


def class_counts(labels, names: list) -> list:
    """Train rows per class (a document's chunks each count: they are what the loss sees)."""
    import numpy as np

    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(names)).tolist()


TASK = Task(
    name="classification",
    stages=stages,
    data_info=data_info,
    validate=validate,
    columns=("label",),
    metrics=METRICS,
    collator=collate.Collator,
    weighted_loss=weighted_loss,
    class_counts=class_counts,
    margins=margins,
    build_model=model.build_model,
    model_class=model.model_class,
    score=score_logits,
    check_model=evaluate.check_model,
    evaluate=evaluate.evaluate,
    write_report=evaluate.write_report,
    summary=report.format_table,
    predictions=aggregate.predictions,
    peft_task_type="SEQ_CLS",
    head=head,
    pipeline_tag="text-classification",
    model_kind="text classifier",
    card_data=card_data,
    card_metrics=card_metrics,
    sections=("label",),
    pairs=True,
    cpu_bf16_attention="eager",
)
