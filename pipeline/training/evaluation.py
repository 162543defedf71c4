"""Validation during training: loss, accuracy and macro-F1, summed exactly across processes.

Each rank evaluates a disjoint contiguous shard; the ranks add up their loss sums and confusion
matrices with one all-reduce, so no example is counted twice (no padding of the last shard).
"""

from __future__ import annotations

import numpy as np

from pipeline.training.batching import Collator, make_loader, shard_range


def metrics_from_confusion(cm: np.ndarray, loss_sum: float) -> dict:
    """cm[true, pred] counts -> loss (mean), accuracy, macro-F1 (over classes present in truth or preds)."""
    n = cm.sum()
    tp = np.diag(cm).astype(float)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    denom = support + predicted
    present = denom > 0
    f1 = np.where(present, 2 * tp / np.maximum(denom, 1), 0.0)
    return {
        "loss": float(loss_sum / max(n, 1)),
        "accuracy": float(tp.sum() / max(n, 1)),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "examples": int(n),
    }


def evaluate(acc, model, ds, collate: Collator, batch_size: int, num_labels: int) -> dict:
    import torch

    rows = shard_range(len(ds), acc.process_index, acc.num_processes)
    lengths = np.asarray(ds["length"][rows.start : rows.stop]) if len(rows) else np.zeros(0, int)
    order = rows.start + np.argsort(-lengths, kind="stable")  # similar lengths together: less padding
    batches = [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    cm = torch.zeros(num_labels * num_labels, dtype=torch.float64, device=acc.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in make_loader(ds, batches, collate):
            batch = {k: v.to(acc.device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            loss_sum += torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="sum").double()
            cm += torch.bincount(batch["labels"] * num_labels + logits.argmax(-1), minlength=num_labels**2).double()
    model.train(was_training)
    if acc.num_processes > 1:
        cm, loss_sum = acc.reduce(cm, reduction="sum"), acc.reduce(loss_sum, reduction="sum")
    return metrics_from_confusion(cm.cpu().numpy().reshape(num_labels, num_labels).astype(np.int64), loss_sum.item())

