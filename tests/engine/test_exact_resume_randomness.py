"""Per-sample augmentation seeds, saved RNG states, and skipped images seen from workers."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from detr_peg.data.coco_dataset import build_coco_dataset
from detr_peg.data.collate import collate_detection
from detr_peg.data.epoch_samples import EpochSampleDataset, sample_seed
from detr_peg.engine.checkpointing import capture_rng_state, restore_rng_state
from detr_peg.engine.loader import EpochBatchSampler
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return synthetic_data(tmp_path_factory.mktemp("shapes")).root


def _train_set(shapes: Path, tmp: Path, *extra: str):
    data = synthetic_data(shapes)  # already written: returns the paths
    cfg = tiny_config(synthetic_overrides(data, tmp, "data.crop_prob=0.5", "data.hflip_prob=0.5", *extra))
    return build_coco_dataset(cfg.data, "train")


def _equal(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1]["boxes"], b[1]["boxes"])


def test_sample_seed_mixes_its_inputs() -> None:
    seeds = {sample_seed(s, e, i) for s in (0, 1) for e in (0, 1, 2) for i in range(50)}
    assert len(seeds) == 2 * 3 * 50
    assert sample_seed(0, 1, 2) == sample_seed(0, 1, 2)


def test_a_sample_depends_only_on_seed_epoch_and_index(shapes: Path, tmp_path: Path) -> None:
    ds = EpochSampleDataset(_train_set(shapes, tmp_path), seed=5)
    first = [ds[(0, i)] for i in range(6)]
    torch.manual_seed(123)  # the global generators do not matter
    again = [ds[(0, i)] for i in reversed(range(6))][::-1]
    assert all(_equal(a, b) for a, b in zip(first, again))
    other_epoch = [ds[(1, i)] for i in range(6)]
    assert not all(_equal(a, b) for a, b in zip(first, other_epoch))
    assert all(t["skipped_image_ids"] == [] for _, t in first)


def test_reading_a_sample_leaves_the_global_generators_alone(shapes: Path, tmp_path: Path) -> None:
    ds = EpochSampleDataset(_train_set(shapes, tmp_path), seed=5)
    torch.manual_seed(0)
    random.seed(0)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(0)
    random.seed(0)
    ds[(0, 1)]
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_batches_are_the_same_with_and_without_workers(shapes: Path, tmp_path: Path) -> None:
    ds = EpochSampleDataset(_train_set(shapes, tmp_path), seed=5)

    def batches(workers: int):
        sampler = EpochBatchSampler(num_samples=len(ds), batch_size=2, epoch=2, seed=5)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_detection, num_workers=workers)
        return list(loader)

    for (ia, ma, ta), (ib, mb, tb) in zip(batches(0), batches(2)):
        assert torch.equal(ia, ib) and torch.equal(ma, mb)
        assert all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(ta, tb))


def test_skipped_images_are_reported_from_worker_processes(shapes: Path, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(shapes, root)
    broken = sorted((root / "train").iterdir())[2]
    broken.write_bytes(b"not an image")
    data = synthetic_data(root)
    cfg = tiny_config(synthetic_overrides(data, tmp_path, "data.on_bad_sample=skip"))
    ds = EpochSampleDataset(build_coco_dataset(cfg.data, "train"), seed=0)
    bad_id = ds.dataset.ids[2]
    sampler = EpochBatchSampler(num_samples=len(ds), batch_size=2, epoch=0, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_detection, num_workers=2)
    reported = [i for _, _, targets in loader for t in targets for i in t["skipped_image_ids"]]
    assert reported == [bad_id]


def test_rng_state_round_trip() -> None:
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    state = capture_rng_state(torch.device("cpu"))
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(9)
    random.seed(9)
    np.random.seed(9)
    restore_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(2), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]
