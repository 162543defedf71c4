"""A classification batch: the padded token ids and the class ids."""

from __future__ import annotations

from typing import Any

from pipeline.inference.padding import pad


class Collator:
    """Pads a list of examples (see `pad`) and stacks their labels; returns torch tensors."""

    def __init__(self, pad_id: int, multiple: int = 8, max_length: int = 0):
        self.pad_id, self.multiple, self.max_length = pad_id, multiple, max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = pad([r["input_ids"] for r in rows], self.pad_id, self.multiple, self.max_length)
        return {**batch, "labels": torch.as_tensor([r["label"] for r in rows], dtype=torch.long)}
