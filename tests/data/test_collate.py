"""collate_detection: padded batch, padding mask (True = padding), targets untouched."""

from __future__ import annotations

import functools

import pytest
import torch

from detr_peg.data.collate import collate_detection


def test_mask_and_images() -> None:
    torch.manual_seed(0)
    shapes = [(5, 7), (9, 4), (6, 6)]
    batch = [(torch.randn(3, h, w), {"image_id": i, "size": torch.tensor([h, w])}) for i, (h, w) in enumerate(shapes)]
    images, mask, targets = collate_detection(batch)
    assert images.shape == (3, 3, 9, 7) and mask.shape == (3, 9, 7) and mask.dtype == torch.bool
    for i, (h, w) in enumerate(shapes):
        expected_mask = torch.ones(9, 7, dtype=torch.bool)
        expected_mask[:h, :w] = False
        assert torch.equal(mask[i], expected_mask)
        assert torch.equal(images[i, :, :h, :w], batch[i][0])
        assert torch.equal(images[i][:, expected_mask], torch.zeros(3, int(expected_mask.sum())))
        assert targets[i] is batch[i][1]


def test_size_divisibility() -> None:
    batch = [(torch.ones(3, 5, 7), {}), (torch.ones(3, 3, 9), {})]
    images, mask, _ = functools.partial(collate_detection, size_divisibility=4)(batch)
    assert images.shape == (2, 3, 8, 12)
    assert mask[0, :5, :7].logical_not().all() and mask[0].sum() == 8 * 12 - 35
    assert mask[1, :3, :9].logical_not().all() and mask[1].sum() == 8 * 12 - 27


def test_single_image_has_no_padding() -> None:
    image = torch.randn(3, 4, 6)
    images, mask, _ = collate_detection([(image, {})])
    assert torch.equal(images[0], image) and not mask.any()


def test_empty_batch() -> None:
    with pytest.raises(ValueError):
        collate_detection([])
