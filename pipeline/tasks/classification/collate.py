"""A classification batch: the padded token ids (and a pair's token types) and the targets."""

from __future__ import annotations

from typing import Any

from pipeline.inference.padding import pad

TOKEN_TYPES = "token_type_ids"  # the tokenize stage's column for sentence pairs where the model takes them


class Collator:
    """Pads a list of examples (see `pad`) and stacks their targets; returns torch tensors. The multilabel
    and regression tasks change only `targets`."""

    def __init__(self, pad_id: int, multiple: int = 8, max_length: int = 0):
        self.pad_id, self.multiple, self.max_length = pad_id, multiple, max_length

    def targets(self, rows: list[dict[str, Any]]) -> Any:
        """The class ids, (batch,) long."""
        import torch

        return torch.as_tensor([r["label"] for r in rows], dtype=torch.long)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        types = [r[TOKEN_TYPES] for r in rows] if TOKEN_TYPES in rows[0] else None
        batch = pad([r["input_ids"] for r in rows], self.pad_id, self.multiple, self.max_length, types)
        return {**batch, "labels": self.targets(rows)}
