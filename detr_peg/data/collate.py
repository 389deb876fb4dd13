"""Batch detection samples of different image sizes for a data loader."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from detr_peg.data.padding import pad_images


def collate_detection(
    batch: Sequence[tuple[Tensor, dict[str, Any]]], size_divisibility: int = 0
) -> tuple[Tensor, Tensor, list[dict[str, Any]]]:
    """Pad a batch of ``(image [3, H_i, W_i], target)`` pairs (:func:`pad_images`); targets stay a list.

    Returns ``(images [B, 3, H, W], mask bool [B, H, W] True on padding, targets)``; images sit top-left on zeros
    and the targets' normalised boxes stay relative to the unpadded image (``target["size"]``).
    """
    if len(batch) == 0:
        raise ValueError("collate_detection needs at least one sample")
    images, mask = pad_images([image for image, _ in batch], size_divisibility=size_divisibility)
    return images, mask, [target for _, target in batch]
