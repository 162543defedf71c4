"""What a regression evaluation leaves in the run directory, and the table it prints.

<run_dir>/eval/<split>-<checkpoint>/
  metrics.json            target, scale, chunk- and document-level metrics, the train mean's errors, run facts
  predictions.jsonl       one row per example (chunk): id, chunk, text snippet, target, prediction
  documents.jsonl         one row per document: chunk predictions averaged
  scatter.png             prediction against target (chunks), the y = x line, Pearson's r in the title
  scatter_documents.png   the same per document, when some document has several chunks
  tensorboard/            the scalars and the scatter figure
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.escape import plot_label
from pipeline.tasks.classification.report import header_lines

LEVEL_METRICS = (("pearson", "Pearson"), ("spearman", "Spearman"), ("mse", "MSE"), ("rmse", "RMSE"), ("mae", "MAE"))


def scatter_figure(targets, predictions, scale: list, title: str, level: dict) -> Any:
    """Prediction against target, one dot a row, with the y = x line across the scale and the data."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    t, p = np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    ends = [*scale, *((t.min(), t.max(), p.min(), p.max()) if len(t) else ())]
    margin = (max(ends) - min(ends)) * 0.02 or 0.5
    low, high = min(ends) - margin, max(ends) + margin
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.scatter(t, p, s=8, alpha=min(1.0, max(0.1, 200 / max(len(t), 1))), edgecolors="none")
    ax.plot([low, high], [low, high], color="grey", linewidth=1, linestyle="--", label="y = x")
    ax.set(xlim=(low, high), ylim=(low, high), xlabel="target", ylabel="prediction", aspect="equal",
           title=f"{plot_label(title)} ({len(t)}): Pearson {level['pearson']:.4f}, MSE {level['mse']:.4f}")
    ax.legend(loc="upper left")
    return fig


def write_scatter(path: Path, targets, predictions, scale: list, title: str, level: dict) -> None:
    figure = scatter_figure(targets, predictions, scale, title, level)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)


def write_tensorboard(out: Path, metrics: dict, targets, predictions, step: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    split = metrics["split"]
    writer = SummaryWriter(log_dir=str(out / "tensorboard"))
    try:
        for level in ("chunk", "document"):
            for key, _ in LEVEL_METRICS:
                writer.add_scalar(f"eval_{split}/{level}/{key}", metrics[level][key], step)
        figure = scatter_figure(targets, predictions, metrics["scale"], f"{split}, chunks", metrics["chunk"])
        writer.add_figure(f"eval_{split}/scatter", figure, step)  # closes the figure
    finally:
        writer.close()


def format_table(metrics: dict) -> str:
    """The readable summary printed at the end: the run facts, then each metric for chunks and documents, and a
    mean predictor's errors beside them."""
    chunk, doc, base = metrics["chunk"], metrics["document"], metrics["baseline"]
    low, high = metrics["scale"]
    lines = [
        *header_lines(metrics),
        f"target '{metrics['target']}', scale [{low:g}, {high:g}]",
        "",
        f"{'metric':<10} {'chunks':>8} {'documents':>10}",
    ]
    lines += [f"{title:<10} {chunk[key]:>8.4f} {doc[key]:>10.4f}" for key, title in LEVEL_METRICS]
    lines += ["", f"predicting the train mean ({base['predicts']:.4g}) for every row: MSE {base['chunk']['mse']:.4f} "
              f"(chunks), {base['document']['mse']:.4f} (documents)", "", f"outputs: {metrics['output_dir']}"]
    return "\n".join(lines)
