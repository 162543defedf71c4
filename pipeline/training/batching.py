"""Deterministic per-rank batches and dynamic padding.

The order of an epoch is a pure function of (seed, epoch, lengths, global batch size), so a
resumed run rebuilds it in O(n log n) and starts at any batch index without touching the batches
before it. Every optimizer step consumes one *global* batch of `batch_size * world` examples per
micro-step; rank r takes slice r of it. Hence one process at batch 2B and two at batch B see the
same examples per step, the ranks' shards are disjoint, and together they cover the epoch (less
the remainder that does not fill a global batch).

We shard ourselves instead of letting `accelerator.prepare` wrap the DataLoader: accelerate
would re-shard our batch sampler (BatchSamplerShard) and its `skip_first_batches` iterates the
skipped batches, which is exactly the cost resume must not have.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

MEGABATCH = 50  # length grouping sorts windows of 50 global batches (as transformers' LengthGroupedSampler)


def epoch_order(lengths: np.ndarray, seed: int, epoch: int, global_batch: int, group_by_length: bool) -> np.ndarray:
    """Global batches of one epoch: an int64 array of shape (num_batches, global_batch) of row indices."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))  # platform-independent stream
    perm = rng.permutation(len(lengths))
    usable = (len(perm) // global_batch) * global_batch
    if group_by_length:
        window = MEGABATCH * global_batch
        chunks = [perm[i : i + window] for i in range(0, len(perm), window)]
        # stable sort, longest first, inside each window: batches of similar length, little padding
        perm = np.concatenate([c[np.argsort(-lengths[c], kind="stable")] for c in chunks])
        # every window but the last is a multiple of global_batch, so the cut only trims the last
        batches = perm[:usable].reshape(-1, global_batch)
        return batches[rng.permutation(len(batches))]  # mix short and long batches across the epoch
    return perm[:usable].reshape(-1, global_batch)


def steps_per_epoch(num_rows: int, batch_size: int, world: int, grad_accum: int) -> int:
    """Optimizer steps in one epoch; batches that do not fill an accumulation window are dropped."""
    return (num_rows // (batch_size * world)) // grad_accum


class RankBatches:
    """The batch sampler of one rank for one epoch, starting at micro-batch `start`."""

    def __init__(self, order: np.ndarray, rank: int, batch_size: int, start: int, stop: int):
        self.order, self.rank, self.batch_size, self.start, self.stop = order, rank, batch_size, start, stop

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[list[int]]:
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        for b in range(self.start, self.stop):
            yield self.order[b, lo:hi].tolist()


class _Rows:
    """Map-style view of an Arrow dataset that fetches a whole batch in one call."""

    def __init__(self, ds, columns: tuple):
        self.ds, self.columns = ds.select_columns(list(columns)), columns

    def __len__(self) -> int:
        return len(self.ds)

    def __getitems__(self, idx: list[int]) -> list[dict]:
        cols = self.ds[idx]
        return [dict(zip(self.columns, values)) for values in zip(*(cols[c] for c in self.columns))]

    def __getitem__(self, i: int) -> dict:
        return self.__getitems__([i])[0]


def make_loader(ds, sampler, collate: Any, num_workers: int = 0, pin_memory: bool = False, *, columns: tuple):
    """A DataLoader over our sampler. Its own generator keeps it from drawing on the global torch RNG
    (an iterator otherwise draws a base seed from it, which would shift dropout after a resume).
    pin_memory (on a GPU) lets the loop's `.to(device, non_blocking=True)` overlap the copy with compute."""
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(
        _Rows(ds, columns),  # (input_ids, then the task's columns)
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(0),
        persistent_workers=False,
    )
