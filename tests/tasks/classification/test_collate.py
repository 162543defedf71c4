"""A classification batch (pipeline/tasks/classification/collate.py)."""

from __future__ import annotations

from pipeline.tasks.classification.collate import Collator


def test_collator_pads_to_a_multiple_within_max_length():
    rows = [{"input_ids": [5, 6, 7], "label": 1}, {"input_ids": [5] * 9, "label": 0}]
    out = Collator(pad_id=0, multiple=8, max_length=12)(rows)
    assert out["input_ids"].shape == (2, 12)  # 9 rounds up to 16, capped at max_length 12
    assert out["attention_mask"].sum().item() == 12 and out["input_ids"][0, 3:].eq(0).all()
    assert out["labels"].tolist() == [1, 0]
    assert Collator(0, 8)(rows)["input_ids"].shape == (2, 16)
    assert Collator(0, 0)(rows)["input_ids"].shape == (2, 9)
