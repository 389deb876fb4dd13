"""Batch images of different sizes into one padded tensor and its padding mask; grow a padded batch further."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
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


def further_padding(
    fraction: float, size_divisibility: int = 1
) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
    """:func:`pad_further` by ``fraction`` as a batch hook (``run_inference``'s ``pad``); None for 0 (no change)."""
    if fraction <= 0:
        return None
    return lambda images, mask: pad_further(images, mask, fraction, size_divisibility)


def pad_further(images: Tensor, mask: Tensor, fraction: float, size_divisibility: int = 1) -> tuple[Tensor, Tensor]:
    """Grow a padded batch by ``fraction`` of its size on the right and bottom (zeros, mask True).

    Args:
        images: ``Tensor[B, C, H, W]``.
        mask: ``Tensor[B, H, W]`` bool, True = padding.
        fraction: the growth, relative to ``H`` and ``W``.
        size_divisibility: the grown size is rounded up to a multiple of it.

    Returns:
        ``Tensor[B, C, H', W']`` and ``Tensor[B, H', W']`` with ``H'`` the
        multiple of ``size_divisibility`` at or above ``ceil(H * (1 + fraction))``.
    """
    h, w = mask.shape[-2:]
    step = max(size_divisibility, 1)
    new_h = -(-math.ceil(h * (1 + fraction)) // step) * step
    new_w = -(-math.ceil(w * (1 + fraction)) // step) * step
    extra_h, extra_w = new_h - h, new_w - w
    return F.pad(images, (0, extra_w, 0, extra_h)), F.pad(mask, (0, extra_w, 0, extra_h), value=True)
