"""Batch images of different sizes into one padded tensor and its padding mask; grow a padded batch further."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def pad_images(images: Sequence[Tensor], size_divisibility: int = 0) -> tuple[Tensor, Tensor]:
    """Pad ``[C, H_i, W_i]`` images (same C, dtype, device) top-left onto zeros, rounded up to ``size_divisibility``.

    Returns ``(batch [B, C, H, W], mask bool [B, H, W])``, mask True on padding.
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
    """Grow a padded batch on the right and bottom (zeros, mask True) to ``ceil(H * (1 + fraction))``, likewise W.

    The grown sides are rounded up to a multiple of ``size_divisibility``; ``mask`` is bool, True on padding.
    """
    h, w = mask.shape[-2:]
    step = max(size_divisibility, 1)
    new_h = -(-math.ceil(h * (1 + fraction)) // step) * step
    new_w = -(-math.ceil(w * (1 + fraction)) // step) * step
    extra_h, extra_w = new_h - h, new_w - w
    return F.pad(images, (0, extra_w, 0, extra_h)), F.pad(mask, (0, extra_w, 0, extra_h), value=True)
