"""Batch planning, padding and single-process inference against an unbatched forward pass."""

import numpy as np
import pytest

from pipeline.inference import predict


@pytest.mark.parametrize("n,batch,world", [(13, 4, 2), (13, 4, 3), (5, 8, 2), (1, 4, 2), (64, 7, 4)])
def test_shards_cover_every_index_exactly_once(n, batch, world):
    lengths = np.random.default_rng(n).integers(1, 30, n)
    batches = predict.plan_batches(lengths, batch)
    seen = np.concatenate([np.concatenate(predict.shard(batches, r, world) or [np.zeros(0, int)]) for r in range(world)])
    assert sorted(seen.tolist()) == list(range(n))
    assert all(len(b) <= batch for b in batches)
    flat = np.concatenate(batches)
    assert np.all(np.diff(lengths[flat]) <= 0)  # longest first: a batch pads to similar lengths


def test_padding_is_right_to_a_multiple_masked_and_exact_on_a_cpu():
    from pipeline.inference.padding import pad, pad_multiple

    out = pad([[5, 6, 7], [8]], pad_id=0, multiple=4)
    assert out["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert pad([[1] * 9], pad_id=3, multiple=8)["input_ids"].shape == (1, 16)
    assert pad([[1, 2]], pad_id=3, multiple=1)["input_ids"].shape == (1, 2)
    assert (pad_multiple("cpu", 8), pad_multiple("cuda", 8)) == (0, 8)


def test_place_refuses_missing_or_repeated_examples():
    logits = np.eye(3, dtype=np.float32)
    np.testing.assert_array_equal(predict._place(np.array([2, 0, 1]), logits, 3), logits[[1, 2, 0]])
    with pytest.raises(RuntimeError, match="missing \\[2\\]"):
        predict._place(np.array([0, 1]), logits[:2], 3)
    with pytest.raises(RuntimeError, match="repeated \\[1\\]"):
        predict._place(np.array([0, 1, 1]), logits, 3)
    with pytest.raises(ValueError, match="batch_size"):
        predict.plan_batches([1, 2], 0)


def test_batched_logits_equal_one_example_at_a_time_in_dataset_order(world):
    import datasets
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    ds = datasets.load_from_disk(str(world.stage_dir / "data"))["test"]
    model = AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval()
    got = predict.predict_logits(model, ds, batch_size=4, accelerator=Accelerator(cpu=True), progress=False)
    with torch.inference_mode():
        want = np.concatenate([model(input_ids=torch.tensor([ids])).logits.numpy() for ids in ds["input_ids"]])
    assert got.shape == (13, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)  # padding is masked; order restored


@pytest.mark.parametrize("native", [False, True])
def test_bf16_autocast_warns_only_on_a_cpu_without_native_bf16(native, monkeypatch, capsys):
    import torch

    from pipeline import accel
    from pipeline.inference import backends

    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: native)
    with backends.autocast(torch.device("cpu"), "bf16"):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.bfloat16
    assert ("WARNING: eval.precision=bf16" in capsys.readouterr().err) is not native
    for other in ("fp32", "int8"):
        with backends.autocast(torch.device("cpu"), other):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
