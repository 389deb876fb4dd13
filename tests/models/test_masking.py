"""Padding masks at feature-map resolution: the index-selection form used under export equals the
legacy nearest interpolation of the official code."""

from __future__ import annotations

import pytest
import torch

from detr_peg.models.masking import downsample_mask, select_nearest


@pytest.mark.parametrize("stride", [8, 16, 32, 64])
def test_select_nearest_equals_nearest_interpolation(stride):
    g = torch.Generator().manual_seed(stride)
    for height in range(1, 400, 17):
        for width in (height, height + 33, 1066):
            mask = torch.rand(2, height, width, generator=g) > 0.5
            size = (-(-height // stride), -(-width // stride))  # the backbone's rounding up
            assert torch.equal(select_nearest(mask, size), downsample_mask(mask, size)), (height, width, stride)
    mask = torch.rand(1, 50, 70, generator=g) > 0.5
    for size in [(50, 70), (7, 3), (1, 1), (13, 29)]:  # any size, not only strided ones
        assert torch.equal(select_nearest(mask, size), downsample_mask(mask, size)), size
