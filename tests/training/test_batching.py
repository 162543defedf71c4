"""Batch order: deterministic per (seed, epoch), disjoint per-rank shards that cover the epoch,
length grouping that cuts padding, and a resume position that needs no skipped batches."""

from __future__ import annotations

import numpy as np

from pipeline.training import batching


def _lengths(n=1000, seed=0):
    return np.random.default_rng(seed).integers(3, 120, size=n)


def test_order_is_a_function_of_seed_and_epoch():
    lengths = _lengths()
    for group in (False, True):
        a = batching.epoch_order(lengths, 7, 2, 32, group)
        assert np.array_equal(a, batching.epoch_order(lengths, 7, 2, 32, group))
        assert not np.array_equal(a, batching.epoch_order(lengths, 7, 3, 32, group))
        assert a.shape == (1000 // 32, 32) and len(np.unique(a)) == a.size  # no row twice


def test_rank_shards_are_disjoint_and_cover_the_global_batches():
    lengths = _lengths(503)
    world, bs = 2, 8
    order = batching.epoch_order(lengths, 1, 0, bs * world, True)
    shards = [list(batching.RankBatches(order, r, bs, 0, len(order))) for r in range(world)]
    flat = [set(i for b in s for i in b) for s in shards]
    assert not flat[0] & flat[1]
    assert flat[0] | flat[1] == set(order.ravel().tolist())
    # one process at batch 16 sees exactly the union of the two ranks' batches at each step
    single = list(batching.RankBatches(order, 0, bs * world, 0, len(order)))
    assert all(set(single[b]) == set(shards[0][b]) | set(shards[1][b]) for b in range(len(order)))


def test_resume_position_starts_at_the_batch_directly():
    order = batching.epoch_order(_lengths(), 3, 0, 16, True)
    full = list(batching.RankBatches(order, 0, 16, 0, len(order)))
    assert list(batching.RankBatches(order, 0, 16, 17, len(order))) == full[17:]
    assert len(batching.RankBatches(order, 0, 16, 17, len(order))) == len(order) - 17


def test_length_grouping_cuts_padding():
    lengths = _lengths(4000)

    def padding(order):
        widths = lengths[order].max(axis=1, keepdims=True)
        return 1 - lengths[order].sum() / (widths * np.ones_like(order)).sum()

    plain = padding(batching.epoch_order(lengths, 0, 0, 32, False))
    grouped = padding(batching.epoch_order(lengths, 0, 0, 32, True))
    assert plain > 0.4 and grouped < 0.05


def test_steps_per_epoch_drops_partial_windows():
    assert batching.steps_per_epoch(160, 8, 1, 2) == 10
    assert batching.steps_per_epoch(167, 8, 2, 3) == 3  # 10 global batches of 16 -> 3 windows of 3
    assert batching.steps_per_epoch(10, 8, 2, 1) == 0
