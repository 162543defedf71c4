"""A causal_lm batch: blocks, their position ids and the targets; no attention mask (see pack.py). task=instruct's
rows are the same, with a loss_mask that leaves only the assistant's tokens as targets."""

from __future__ import annotations

from typing import Any

IGNORE = -100  # a label the loss skips


class Collator:
    """Stacks blocks (the last, shorter block of a split padded with `pad_id` as a segment of its own);
    labels are the ids except at each segment's first token, whose only predecessor lies in another
    document (or is padding), at padding, and (rows with a loss_mask: task=instruct) where the mask is 0."""

    def __init__(self, pad_id: int, multiple: int = 8, max_length: int = 0):
        self.pad_id = pad_id if pad_id is not None else 0

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        pad = torch.zeros((len(rows), width), dtype=torch.bool)  # padding, and tokens that are no target
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            if "loss_mask" in r:
                pad[i, :n] = torch.as_tensor(r["loss_mask"], dtype=torch.int8) == 0
            ids[i, :n] = torch.as_tensor(r["input_ids"], dtype=torch.long)
            pos[i, :n] = torch.as_tensor(r["position_ids"], dtype=torch.long)
            pos[i, n:] = torch.arange(width - n)  # padding: a segment of its own, attended by no real token
            pad[i, n:] = True
        return {"input_ids": ids, "position_ids": pos, "labels": ids.masked_fill((pos == 0) | pad, IGNORE)}


def smoothed_loss(logits, labels, weights, smoothing: float) -> Any:
    """train.label_smoothing for a language model: the next-token cross-entropy the model computes (labels shifted
    by one, IGNORE left out, the mean over the targets), its targets smoothed over the vocabulary (Trainer's
    label_smoothing_factor does the same). A vocabulary has no class weights (refused before: class_counts None)."""
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1, :].float().reshape(-1, vocab), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE, label_smoothing=smoothing)


def loss_tokens(batch: dict) -> Any:
    """The targets a batch's loss averages over (transformers shifts labels by one inside the model)."""
    return (batch["labels"][:, 1:] != IGNORE).sum()


def row_losses(model: Any, rows: list[dict], pad_id: int, multiple: int, device: Any) -> Any:
    """(rows, 2): each block's summed negative log-likelihood (nats) of its targets, and their count."""
    import torch

    batch = {k: v.to(device) for k, v in Collator(pad_id)(rows).items()}
    labels = batch.pop("labels")
    logits = model(**batch, use_cache=False).logits.float()[:, :-1]  # a cache turns off packed-sequence masking
    targets = labels[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).clamp(min=0),
                                            reduction="none").view(targets.shape)
    keep = targets != IGNORE
    return torch.stack([(nll * keep).sum(1, dtype=torch.float64), keep.sum(1).double()], 1).detach()
