"""What evaluation leaves in the run directory, and the table it prints.

<run_dir>/eval/<split>-<checkpoint>/
  metrics.json            chunk- and document-level metrics, run facts, which test set was scored (test_set)
  predictions.jsonl       one row per example (chunk): id, chunk, text snippet, label, prediction, probabilities
  documents.jsonl         one row per document: chunk logits averaged
  confusion_matrix.csv/.png               chunk level (rows: true class, columns: predicted)
  confusion_matrix_documents.csv/.png     document level, when some document has several chunks
  tensorboard/            the scalars and the confusion matrix figure
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.escape import plot_label


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def prediction_rows(ids, labels, probs, label_names: list[str], extra: dict[str, list] | None = None) -> list[dict]:
    """One row per prediction; `probs` is (n, classes); `extra` adds columns (name -> one value per row).

    Class names, not ids, so the file reads on its own."""
    rows = []
    for i, p in enumerate(probs):
        row = {"id": ids[i], **{k: v[i] for k, v in (extra or {}).items()}}
        row["label"] = label_names[int(labels[i])]
        row["prediction"] = label_names[int(p.argmax())]
        row["probabilities"] = {name: round(float(v), 6) for name, v in zip(label_names, p)}
        rows.append(row)
    return rows


def snippet(text: str, chars: int) -> str:
    return text[:chars] + ("…" if len(text) > chars else "")


def write_confusion(out: Path, stem: str, matrix: list[list[int]], label_names: list[str], title: str) -> None:
    """CSV (header row of predicted classes, first column true class) and a PNG heat map."""
    with open(out / f"{stem}.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *label_names])
        for name, row in zip(label_names, matrix):
            writer.writerow([name, *row])
    figure = confusion_figure(matrix, label_names, title)
    figure.savefig(out / f"{stem}.png", dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)


def confusion_figure(matrix: list[list[int]], label_names: list[str], title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    cm = np.asarray(matrix)
    size = 1.2 + 0.7 * len(label_names)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(cm, cmap="Blues")
    fig.colorbar(image, ax=ax)
    ticks = range(len(label_names))
    names = [plot_label(n) for n in label_names]  # `$5` is a class, not math
    ax.set(xticks=ticks, yticks=ticks, xticklabels=names, yticklabels=names, xlabel="predicted", ylabel="true",
           title=plot_label(title))
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    for (r, c), value in np.ndenumerate(cm):  # dark cells get white text
        ax.text(c, r, str(value), ha="center", va="center", color="white" if value > cm.max() / 2 else "black")
    return fig


def write_tensorboard(out: Path, metrics: dict, label_names: list[str], step: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    split = metrics["split"]
    writer = SummaryWriter(log_dir=str(out / "tensorboard"))
    try:
        for level in ("chunk", "document"):
            for key in ("accuracy", "macro_f1", "micro_f1"):
                writer.add_scalar(f"eval_{split}/{level}/{key}", metrics[level][key], step)
            for name, values in metrics[level]["per_class"].items():
                writer.add_scalar(f"eval_{split}/{level}/f1_{name}", values["f1"], step)
        figure = confusion_figure(metrics["chunk"]["confusion_matrix"], label_names, f"{split}: confusion matrix")
        writer.add_figure(f"eval_{split}/confusion_matrix", figure, step)  # closes the figure
    finally:
        writer.close()


def _export_note(export: dict | None) -> str:
    if not export:
        return ""
    return " (cached export reused)" if export.get("reused") else " (exported)"


def _chosen_by(metrics: dict) -> str:
    why = metrics.get("precision_chosen_by", "eval.precision")
    return "" if why == "eval.precision" else f" ({why})"


def header_lines(metrics: dict) -> list[str]:
    """The first lines of every classifier's summary (single-label, multilabel, regression): the split and checkpoint,
    examples and speed, precision, attention and runtime, and which test set was scored."""
    chunk, doc = metrics["chunk"], metrics["document"]
    return [
        f"split '{metrics['split']}', checkpoint '{metrics['checkpoint']}' ({metrics['checkpoint_path']})",
        f"{chunk['examples']} examples (chunks) in {doc['examples']} documents, "
        f"{metrics['examples_per_second']:.1f} examples/s on {metrics['processes']} process(es), "
        f"precision {metrics.get('precision', 'fp32')}{_chosen_by(metrics)}, attention {metrics.get('attention', '?')}, "
        f"runtime {metrics.get('runtime', 'torch')}" + _export_note(metrics.get("onnx_export")),
        *([f"test set: {metrics['test_set']}"] if metrics.get("test_set") else []),
    ]


def format_table(metrics: dict) -> str:
    """The readable summary printed at the end: headline metrics, per class, confusion matrix."""
    chunk, doc, names = metrics["chunk"], metrics["document"], metrics["label_names"]
    lines = [
        *header_lines(metrics),
        "",
        f"{'metric':<10} {'chunks':>8} {'documents':>10}",
    ]
    for key, title in (("accuracy", "accuracy"), ("macro_f1", "macro F1"), ("micro_f1", "micro F1")):
        lines.append(f"{title:<10} {chunk[key]:>8.4f} {doc[key]:>10.4f}")
    width = max(8, *(len(n) for n in names))
    lines += ["", f"{'class':<{width}} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>8}   (documents)"]
    for name in names:
        v = doc["per_class"][name]
        lines.append(f"{name:<{width}} {v['precision']:>9.4f} {v['recall']:>7.4f} {v['f1']:>7.4f} {v['support']:>8}")
    lines += ["", "confusion matrix, documents (rows: true, columns: predicted)", " " * width + "".join(f" {n:>{width}}" for n in names)]
    for name, row in zip(names, doc["confusion_matrix"]):
        lines.append(f"{name:<{width}}" + "".join(f" {v:>{width}}" for v in row))
    lines += ["", f"outputs: {metrics['output_dir']}"]
    return "\n".join(lines)
