"""A multi-label batch: classification's (padded token ids, a pair's token types) with multi-hot targets."""

from __future__ import annotations

from typing import Any

from pipeline.tasks.classification import collate


class Collator(collate.Collator):
    def targets(self, rows: list[dict[str, Any]]) -> Any:
        """The multi-hot labels, (batch, labels) float32: what BCEWithLogitsLoss takes."""
        import torch

        return torch.as_tensor([r["label"] for r in rows], dtype=torch.float32)
