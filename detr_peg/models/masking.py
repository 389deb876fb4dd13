"""Padding masks at feature-map resolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def downsample_mask(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """Resize a padding mask to a feature map's size.

    Uses the legacy ``nearest`` interpolation of the official DETR code (never
    pooling), so a pixel of the feature map is padding when the input pixel it
    samples is padding.

    Args:
        mask: ``Tensor[B, H, W]`` bool, True = padding.
        size: ``(H_l, W_l)``.

    Returns:
        ``Tensor[B, H_l, W_l]`` bool, True = padding.
    """
    return F.interpolate(mask[None].float(), size=tuple(size)).to(torch.bool)[0]


def batch_with_mask(images, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Normalise the detector input to a padded batch and its padding mask.

    Args:
        images: ``Tensor[B, 3, H, W]`` (padded batch), or a list of unpadded
            ``Tensor[3, H_i, W_i]`` images (padded here, top-left aligned).
        mask: ``Tensor[B, H, W]`` bool, True = padding; ``None`` means no
            padding for a batch tensor. Must be ``None`` for a list.

    Returns:
        ``(Tensor[B, 3, H, W], Tensor[B, H, W] bool)``.
    """
    from detr_peg.data.padding import pad_images

    if isinstance(images, (list, tuple)):
        if mask is not None:
            raise ValueError("pass either a list of unpadded images or a batch tensor with its mask, not both")
        return pad_images(images)
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be Tensor[B, 3, H, W] or a list of Tensor[3, H, W], got {shape}")
    if mask is None:
        b, _, h, w = images.shape
        return images, torch.zeros((b, h, w), dtype=torch.bool, device=images.device)
    if mask.shape != (images.shape[0], *images.shape[2:]) or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool Tensor[B, H, W] matching images {tuple(images.shape)}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return images, mask
