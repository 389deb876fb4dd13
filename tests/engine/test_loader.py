"""Training order: sharding over processes, epochs, resuming mid-epoch."""

from __future__ import annotations

import pytest

from detr_peg.engine.loader import EpochBatchSampler, batches_per_epoch, check_train_size
from detr_peg.errors import ConfigError


def _batches(**kwargs) -> list[list[tuple[int, int]]]:
    return list(EpochBatchSampler(**kwargs))


def test_processes_together_cover_the_single_process_batches() -> None:
    single = _batches(num_samples=13, batch_size=4, epoch=3, seed=7)
    ranks = [_batches(num_samples=13, batch_size=2, epoch=3, seed=7, rank=r, world_size=2) for r in range(2)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == 3
    for i, batch in enumerate(single):
        assert sorted(batch) == sorted(ranks[0][i] + ranks[1][i])
    assert all(epoch == 3 for batch in single for epoch, _ in batch)


def test_order_changes_with_epoch_and_seed_only() -> None:
    a = _batches(num_samples=20, batch_size=5, epoch=0, seed=1)
    assert a == _batches(num_samples=20, batch_size=5, epoch=0, seed=1)
    assert [i for b in a for _, i in b] != [
        i for b in _batches(num_samples=20, batch_size=5, epoch=1, seed=1) for _, i in b
    ]
    assert [i for b in a for _, i in b] != [
        i for b in _batches(num_samples=20, batch_size=5, epoch=0, seed=2) for _, i in b
    ]
    assert sorted(i for b in a for _, i in b) == list(range(20))


def test_start_batch_skips_the_batches_already_done() -> None:
    full = EpochBatchSampler(num_samples=10, batch_size=2, epoch=1, seed=0)
    rest = EpochBatchSampler(num_samples=10, batch_size=2, epoch=1, seed=0, start_batch=3)
    assert list(rest) == list(full)[3:]
    assert len(rest) == 2 and rest.batches_per_epoch == full.batches_per_epoch == 5


def test_iterations_per_epoch() -> None:
    assert batches_per_epoch(100, 4, 1) == 25
    assert batches_per_epoch(101, 4, 2) == 12  # 51 per process, whole batches only
    with pytest.raises(ConfigError, match="fewer than train.batch_size 4 x 2 processes"):
        check_train_size(5, 4, 2)
