"""Batched inference over a prepared split, spread over the processes of `accelerate launch`.

Every process plans the same batches (example indices, longest first, so each batch pads to
a similar length), runs every world_size-th batch, and all processes then gather
(index, logits) rows. The bookkeeping is by example index: the padding rows a short shard adds
for the collective carry index -1 and are dropped, and a gathered index that is missing or
repeated is an error, so the padded tail is neither dropped nor counted twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.inference import backends
from pipeline.inference.padding import pad, pad_multiple


def plan_batches(lengths: list[int] | np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Example indices in batches, longest first: similar lengths share a batch (little padding)."""
    if batch_size < 1:
        raise ValueError(f"eval.batch_size must be >= 1, got {batch_size}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def shard(batches: list[np.ndarray], rank: int, world: int) -> list[np.ndarray]:
    """This process's batches: every world-th one, so the long and short batches spread evenly."""
    return batches[rank::world]


def _pad_id(model: Any) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if pad is not None else 0  # padded positions are masked; the id only has to exist


def _gather_rows(accelerator: Any, index: np.ndarray, logits: np.ndarray, rows_max: int) -> tuple[np.ndarray, np.ndarray]:
    """All processes' (index, logits) rows; each shard is padded to rows_max with index -1 first."""
    import torch

    pad = rows_max - len(index)
    index_t = torch.from_numpy(np.concatenate([index, np.full(pad, -1, dtype=np.int64)]))
    logits_t = torch.from_numpy(np.concatenate([logits, np.zeros((pad, logits.shape[1]), dtype=np.float32)]))
    index_all = accelerator.gather(index_t.to(accelerator.device)).cpu().numpy()
    logits_all = accelerator.gather(logits_t.to(accelerator.device)).cpu().numpy()
    keep = index_all >= 0
    return index_all[keep], logits_all[keep]


def _place(index: np.ndarray, logits: np.ndarray, n: int) -> np.ndarray:
    """(n, classes) logits in dataset order; every index must arrive exactly once."""
    counts = np.bincount(index, minlength=n)
    if len(counts) != n or counts.min(initial=1) != 1 or counts.max(initial=1) != 1:
        missing, repeated = np.flatnonzero(counts[:n] == 0), np.flatnonzero(counts > 1)
        raise RuntimeError(f"gathered predictions are inconsistent: missing {missing[:10]}, repeated {repeated[:10]}")
    out = np.empty((n, logits.shape[1]), dtype=np.float32)
    out[index] = logits
    return out


def predict_logits(
    model: Any, dataset: Any, batch_size: int, accelerator: Any, precision: str = "fp32", progress: bool = True,
    runtime: str = "torch", onnx_dir: Any = None, scratch: Any = None, outputs: Any = None, columns: tuple = (),
    width: int = 0, ready: Any = None,
) -> np.ndarray:
    """(len(dataset), k) float32 outputs in dataset order, on every process: a sequence classifier's logits
    (k = num_labels), or with `outputs` (a task's own per-row outputs, Task.outputs, of `columns`) k = `width`.

    `precision` (backends.PRECISIONS) and `runtime` (backends.RUNTIMES) are applied here, so
    evaluate.py and validation run them alike; int8 and onnxruntime work on a copy or an export and
    leave `model` as it was. onnx_dir / scratch: where an onnxruntime export is cached / made
    temporarily (backends.for_inference). `ready`: what for_inference made of `model` already, reused (predict.py
    calls this once per part of its input; an int8 copy or an ONNX Runtime session is made once)."""
    import torch
    from tqdm.auto import tqdm

    sequences = dataset["input_ids"][:]  # list of token-id lists; (n, ragged)
    types = dataset["token_type_ids"][:] if "token_type_ids" in dataset.column_names else None  # sentence pairs
    extra = {c: dataset[c][:] for c in columns if c != "input_ids"} if outputs is not None else {}
    rank, world = accelerator.process_index, accelerator.num_processes
    batches = plan_batches([len(s) for s in sequences], batch_size)
    mine = shard(batches, rank, world)
    model = ready if ready is not None else backends.for_inference(
        model.to(accelerator.device).eval(), precision, accelerator.device, runtime, onnx_dir, scratch)
    pad_id, index, chunks = _pad_id(model), [], []
    multiple = pad_multiple(accelerator.device.type, 8)
    bar = tqdm(total=sum(len(b) for b in mine), unit="ex", desc=f"predict[{rank}]", disable=not (progress and accelerator.is_main_process))
    with torch.inference_mode(), backends.autocast(accelerator.device, precision):
        for batch in mine:
            if outputs is not None:  # the task's own per-row outputs
                rows = [{"input_ids": sequences[i], **{c: v[i] for c, v in extra.items()}} for i in batch]
                chunks.append(outputs(model, rows, pad_id, multiple, accelerator.device).float().cpu().numpy())
            else:
                padded = pad([sequences[i] for i in batch], pad_id, multiple,
                             token_types=None if types is None else [types[i] for i in batch])
                inputs = {k: v.to(accelerator.device) for k, v in padded.items()}
                chunks.append(model(**inputs).logits.float().cpu().numpy())  # (batch, num_labels)
            index.append(batch)
            bar.update(len(batch))
    bar.close()
    num_labels = chunks[0].shape[1] if chunks else (width or model.config.num_labels)  # a process with no rows
    index_np = np.concatenate(index) if index else np.zeros(0, dtype=np.int64)
    logits_np = np.concatenate(chunks) if chunks else np.zeros((0, num_labels), dtype=np.float32)
    if world > 1:
        rows_max = max(sum(len(b) for b in shard(batches, r, world)) for r in range(world))
        index_np, logits_np = _gather_rows(accelerator, index_np.astype(np.int64), logits_np, rows_max)
    return _place(index_np, logits_np, len(sequences))
