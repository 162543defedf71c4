"""Multi-label text classification (transformers' problem_type multi_label_classification): a label stage maps each
row's labels to a multi-hot vector before tokenize; classification's model with BCE loss; each label predicted where
its sigmoid reaches its threshold (label.threshold, or tuned per label on validation at the end of training and saved
in config.json); micro/macro F1, subset accuracy and per-label precision/recall, per chunk and per document."""

from __future__ import annotations

import dataclasses

from pipeline.data.engines.base import Stage
from pipeline.data.stages import tokenize as tokenize_stage
from pipeline.escape import markdown
from pipeline.tasks import classification
from pipeline.tasks.multilabel import collate, evaluate, label, model, report, score

METRICS = {"micro_f1": True, "macro_f1": True, "subset_accuracy": True, "loss": False}  # True where higher is better


def stages(cfg, tokenize: Stage) -> list[Stage]:
    return [Stage("label", label.label, cfg.label), tokenize]


def data_info(manifests: dict) -> dict:
    stats = manifests["label"]["stats"]
    return {"label_names": stats["label_names"], "threshold": stats["threshold"]}


def validate(cfg) -> None:
    """label.names and label.rules, and train.metric_for_best, checked before any data is read."""
    label.check_config(cfg.label)
    if cfg.train.metric_for_best not in METRICS:
        raise ValueError(f"train.metric_for_best: {cfg.train.metric_for_best!r} is not one of "
                         f"{', '.join(map(repr, METRICS))} (the multilabel task's metrics)")


def score_logits(logits, ds, info: dict) -> dict:
    """Every scalar validation metric (loss, micro/macro F1, subset accuracy, Hamming loss, examples) of (n, k)
    logits at the thresholds of `info` (during training: label.threshold)."""
    names = info["label_names"]
    metrics = score.logit_metrics(logits, score.targets(ds, len(names)), score.thresholds(info), names)
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def final_config(logits, ds, info: dict, cfg) -> dict:
    """config.json's label_thresholds: with label.tune_thresholds, each label's best-F1 threshold on the final
    model's validation logits (label.threshold for a label without a positive there); else label.threshold."""
    names, default = info["label_names"], cfg.label.threshold
    cut = (score.tune(score.sigmoid(logits), score.targets(ds, len(names)), default) if cfg.label.tune_thresholds
           else [default] * len(names))
    return {model.THRESHOLDS: {n: float(t) for n, t in zip(names, cut)}}


def card_data(manifests: dict) -> list[str]:
    """The model card's lines for the label and tokenize stages: each label's documents in train, the tokens."""
    stats = manifests.get("label", {}).get("stats", {})
    lines = []
    if stats:
        counts = stats.get("class_counts", {}).get("train", {})
        none = stats.get("rows_without_labels", {}).get("train", 0)
        lines.append(f"- **Labels in train (documents with each; {none:,} with none)**: "
                     + ", ".join(f"{markdown(k)} {v:,}" for k, v in counts.items()) + ".")
    return lines + ([tokenize_stage.card_line(manifests["tokenize"])] if "tokenize" in manifests else [])


def card_metrics(metrics: dict) -> list[tuple[str, str, float]]:
    """A model card's figures: document-level micro and macro F1 and subset accuracy."""
    d = metrics["document"]
    return [("f1", "Micro F1", d["micro_f1"]), ("f1", "Macro F1", d["macro_f1"]),
            ("accuracy", "Subset accuracy", d["subset_accuracy"])]


def weighted_loss(logits, targets, weights, smoothing: float):
    """Binary cross-entropy per label, each target smoothed to eps/2 and 1-eps/2, each label's term weighted
    (the mean over rows and labels, as the model's own loss), in float32."""
    import torch.nn.functional as F

    smoothed = targets.float() * (1 - smoothing) + 0.5 * smoothing
    return F.binary_cross_entropy_with_logits(logits.float(), smoothed, weight=weights)


def class_counts(targets, names: list) -> list:
    """Train rows holding each label."""
    import numpy as np

    rows = np.asarray(targets, dtype=np.float64).reshape(-1, len(names))
    return rows.sum(axis=0).astype(int).tolist()


# classification's columns, model class, LoRA head, peft task type and pipeline tag; its own labels, loss and scores
TASK = dataclasses.replace(
    classification.TASK,
    name="multilabel",
    stages=stages,
    data_info=data_info,
    validate=validate,
    metrics=METRICS,
    collator=collate.Collator,
    weighted_loss=weighted_loss,
    margins=None,  # several labels per row, no one given label: train.label_audit and label.review_file refused
    class_counts=class_counts,
    build_model=model.build_model,
    score=score_logits,
    check_model=model.check_model,
    evaluate=evaluate.evaluate,
    write_report=evaluate.write_report,
    summary=report.format_table,
    predictions=evaluate.predictions,
    final_config=final_config,
    strata=label.strata,
    model_kind="multi-label text classifier",
    card_data=card_data,
    card_metrics=card_metrics,
)
