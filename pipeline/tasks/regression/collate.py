"""A regression batch: classification's padding (and a pair's token types), float targets."""

from __future__ import annotations

from typing import Any

from pipeline.tasks.classification.collate import Collator as ClassificationCollator


class Collator(ClassificationCollator):
    def targets(self, rows: list[dict[str, Any]]) -> Any:
        """The targets, (batch,) float32: what transformers' MSELoss compares the (batch, 1) outputs with."""
        import torch

        return torch.as_tensor([r["label"] for r in rows], dtype=torch.float32)
