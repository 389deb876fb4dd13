"""Batch images of different sizes into one padded tensor and its padding mask."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_images(images: Sequence[Tensor], size_divisibility: int = 0) -> tuple[Tensor, Tensor]:
    """Pad images to a common size, each in the top-left corner.

    Args:
        images: ``Tensor[C, H_i, W_i]`` each, same ``C``, dtype and device.
        size_divisibility: if > 0, round the padded height and width up to a
            multiple of it.

    Returns:
        ``(batch, mask)``: ``batch`` is ``Tensor[B, C, H, W]`` with zeros in the
        padding; ``mask`` is ``Tensor[B, H, W]`` bool, **True = padding**.
    """
    if len(images) == 0:
        raise ValueError("pad_images needs at least one image")
    if any(img.dim() != 3 for img in images):
        shapes = [tuple(img.shape) for img in images]
        raise ValueError(f"pad_images expects Tensor[C, H, W] images, got shapes {shapes}")
    c = images[0].shape[0]
    h = max(img.shape[1] for img in images)
    w = max(img.shape[2] for img in images)
    if size_divisibility > 0:
        h = -(-h // size_divisibility) * size_divisibility
        w = -(-w // size_divisibility) * size_divisibility
    first = images[0]
    batch = first.new_zeros((len(images), c, h, w))
    mask = torch.ones((len(images), h, w), dtype=torch.bool, device=first.device)
    for i, img in enumerate(images):
        batch[i, :, : img.shape[1], : img.shape[2]].copy_(img)
        mask[i, : img.shape[1], : img.shape[2]] = False
    return batch, mask
