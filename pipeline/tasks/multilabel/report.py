"""What a multi-label evaluation leaves in the run directory, and the table it prints.

<run_dir>/eval/<split>-<checkpoint>/
  metrics.json        chunk- and document-level metrics, each label's threshold, run facts, test_set
  predictions.jsonl   one row per example (chunk): id, chunk, text snippet, labels, predicted, probabilities
  documents.jsonl     one row per document: chunk logits averaged
  per_label.csv       per level and label: threshold, precision, recall, F1, support
  tensorboard/        the scalars
"""

from __future__ import annotations

import csv
from pathlib import Path

from pipeline.tasks.classification.report import header_lines

LEVELS = ("chunk", "document")
HEADLINE = (("micro_f1", "micro F1"), ("macro_f1", "macro F1"), ("subset_accuracy", "subset accuracy"),
            ("hamming_loss", "Hamming loss"))


def names(hot, label_names: list[str]) -> list[str]:
    """The names of a multi-hot row's labels."""
    return [n for n, v in zip(label_names, hot) if v]


def prediction_rows(ids, targets, probs, cut, label_names: list[str], extra: dict[str, list]) -> list[dict]:
    """One row per prediction; `probs` is (n, k) sigmoids, `cut` (k,) thresholds; `extra` adds columns (name -> one
    value per row). Label names, not indices, so the file reads on its own."""
    rows = []
    for i, p in enumerate(probs):
        rows.append({"id": ids[i], **{k: v[i] for k, v in extra.items()}, "labels": names(targets[i], label_names),
                     "predicted": names(p >= cut, label_names),
                     "probabilities": {n: round(float(v), 6) for n, v in zip(label_names, p)}})
    return rows


def write_per_label(path: Path, metrics: dict) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["level", "label", "threshold", "precision", "recall", "f1", "support"])
        for level in LEVELS:
            for name, v in metrics[level]["per_label"].items():
                writer.writerow([level, name, metrics["thresholds"][name], v["precision"], v["recall"], v["f1"],
                                 v["support"]])


def write_tensorboard(out: Path, metrics: dict) -> None:
    from torch.utils.tensorboard import SummaryWriter

    split, step = metrics["split"], metrics["step"]
    writer = SummaryWriter(log_dir=str(out / "tensorboard"))
    try:
        for level in LEVELS:
            for key in ("loss", *dict(HEADLINE)):
                writer.add_scalar(f"eval_{split}/{level}/{key}", metrics[level][key], step)
            for name, values in metrics[level]["per_label"].items():
                writer.add_scalar(f"eval_{split}/{level}/f1_{name}", values["f1"], step)
    finally:
        writer.close()


def format_table(metrics: dict) -> str:
    """The readable summary printed at the end: headline metrics, then per label at the document level."""
    chunk, doc, label_names = metrics["chunk"], metrics["document"], metrics["label_names"]
    lines = [
        *header_lines(metrics),
        "",
        f"{'metric':<16} {'chunks':>8} {'documents':>10}",
    ]
    for key, title in HEADLINE:
        lines.append(f"{title:<16} {chunk[key]:>8.4f} {doc[key]:>10.4f}")
    width = max(8, *(len(n) for n in label_names))
    header = f"{'label':<{width}} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>8} {'threshold':>9}"
    lines += ["", header + "   (documents)"]
    for name in label_names:
        v = doc["per_label"][name]
        lines.append(f"{name:<{width}} {v['precision']:>9.4f} {v['recall']:>7.4f} {v['f1']:>7.4f} {v['support']:>8} "
                     f"{metrics['thresholds'][name]:>9.3f}")
    lines += ["", f"outputs: {metrics['output_dir']}"]
    return "\n".join(lines)
