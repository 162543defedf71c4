"""Dynamic padding, one way for training batches and inference batches alike."""

from __future__ import annotations

from typing import Any


def pad_multiple(device_type: str, multiple: int) -> int:
    """Rounding padded lengths up helps GPU tensor cores; on a CPU it is only wasted work (exact: 0)."""
    return multiple if device_type == "cuda" else 0


def pad(sequences: list[list[int]], pad_id: int, multiple: int = 0, max_length: int = 0,
        token_types: list[list[int]] | None = None) -> dict[str, Any]:
    """Right-pad token ids to the longest, rounded up to `multiple` (capped at max_length when set):
    input_ids and attention_mask, (batch, seq) long tensors, and token_type_ids (padded with 0) when
    `token_types` is given (sentence pairs). Training and evaluation both pad here."""
    import torch

    longest = max(len(s) for s in sequences)
    width = longest
    if multiple > 1:
        width = -(-longest // multiple) * multiple
        if max_length:
            width = max(longest, min(width, max_length))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    out = {"input_ids": ids, "attention_mask": mask}
    if token_types is not None:
        types = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, seq in enumerate(token_types):
            types[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        out["token_type_ids"] = types
    return out
