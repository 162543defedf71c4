"""Regression: one float target per document (STS-B's similarity, a confidence), as transformers' run_glue.py
trains it. A label stage parses raw labels to float32 targets within label.scale; the model is classification's
sequence classifier with one output and problem_type "regression" (MSE loss); validation and evaluation score
the (n, 1) predictions by Pearson, Spearman, MSE and MAE, per chunk and per document."""

from __future__ import annotations

import dataclasses

from pipeline.data.engines.base import Stage
from pipeline.data.stages import tokenize as tokenize_stage
from pipeline.tasks import classification
from pipeline.tasks.regression import collate, evaluate, label, model, report, score, strata

# metric_for_best: True where higher is better; loss is the MSE
METRICS = {"pearson": True, "spearman": True, "mse": False, "mae": False, "loss": False}
TARGET = "target"  # the model's output name where the load stage records no source.label_field


def stages(cfg, tokenize: Stage) -> list[Stage]:
    return [Stage("label", label.label, cfg.label), tokenize]


def data_info(manifests: dict) -> dict:
    """The target's name (source.label_field, as the load stage's manifest records it), its scale, the train
    split's mean (the baseline a model must beat)."""
    stats = manifests["label"]["stats"]
    source = (manifests.get("load", {}).get("config") or [{}])[0]
    return {"target": source.get("label_field") or TARGET, "scale": stats["scale"],
            "train_mean": stats["targets"]["train"]["mean"]}


def validate(cfg) -> None:
    """label.scale, no class keys, and train.metric_for_best, checked before any data is read."""
    label.check_config(cfg.label)
    if cfg.train.metric_for_best not in METRICS:
        raise ValueError(f"train.metric_for_best: {cfg.train.metric_for_best!r} is not one of "
                         f"{', '.join(map(repr, METRICS))} (the regression task's metrics)")


def card_data(manifests: dict) -> list[str]:
    """The model card's lines for the label and tokenize stages: the train targets' scale and spread, the tokens."""
    stats = manifests.get("label", {}).get("stats", {})
    lines = []
    if "targets" in stats:
        t, (low, high) = stats["targets"].get("train", {}), stats["scale"]
        lines.append(f"- **Targets in train** (scale [{low:g}, {high:g}], {stats.get('scale_from', 'found')}): "
                     f"{t.get('count', 0):,}, mean {t.get('mean', 0):.3g} ± {t.get('std', 0):.3g}, range "
                     f"[{t.get('min', 0):.3g}, {t.get('max', 0):.3g}].")
    return lines + ([tokenize_stage.card_line(manifests["tokenize"])] if "tokenize" in manifests else [])


def card_metrics(metrics: dict) -> list[tuple[str, str, float]]:
    """A model card's figures: document-level Pearson, Spearman and MSE (a document's chunks averaged)."""
    d = metrics["document"]
    return [("pearsonr", "Pearson", d["pearson"]), ("spearmanr", "Spearman", d["spearman"]), ("mse", "MSE", d["mse"])]


# a sequence classifier with one output: classification's model class, columns, LoRA head and pipeline tag
TASK = dataclasses.replace(
    classification.TASK,
    name="regression",
    weighted_loss=None,  # no classes: train.label_smoothing and train.class_weights are refused
    margins=None,  # no classes: train.label_audit and label.review_file are refused
    class_counts=None,
    stages=stages,
    data_info=data_info,
    validate=validate,
    metrics=METRICS,
    collator=collate.Collator,
    build_model=model.build_model,
    score=score.score,
    check_model=model.check_model,
    evaluate=evaluate.evaluate,
    write_report=evaluate.write_report,
    summary=report.format_table,
    predictions=evaluate.predictions,
    strata=strata.strata,
    model_kind="text regression model",
    card_data=card_data,
    card_metrics=card_metrics,
)
