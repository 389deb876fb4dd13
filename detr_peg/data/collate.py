"""Batch detection samples of different image sizes for a data loader."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from detr_peg.data.padding import pad_images


def collate_detection(
    batch: Sequence[tuple[Tensor, dict[str, Any]]], size_divisibility: int = 0
) -> tuple[Tensor, Tensor, list[dict[str, Any]]]:
    """Pad the images of a batch to a common size and keep the targets as a list.

    Use as ``DataLoader(dataset, collate_fn=collate_detection)``; for a
    ``size_divisibility`` bind it with ``functools.partial``.

    Args:
        batch: ``(image, target)`` pairs; ``image`` is ``Tensor[3, H_i, W_i]``.
        size_divisibility: if > 0, round the padded size up to a multiple of it.

    Returns:
        ``(images, mask, targets)``: ``images`` is ``Tensor[B, 3, H, W]`` with
        each image in the top-left corner and zeros in the padding; ``mask`` is
        ``Tensor[B, H, W]`` bool, **True = padding**; ``targets`` is the list of
        target dicts, unchanged (their normalized boxes stay relative to the
        unpadded image, whose size is ``target["size"]``).
    """
    if len(batch) == 0:
        raise ValueError("collate_detection needs at least one sample")
    images, mask = pad_images([image for image, _ in batch], size_divisibility=size_divisibility)
    return images, mask, [target for _, target in batch]
