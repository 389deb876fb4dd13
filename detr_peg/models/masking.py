"""Padding masks at feature-map resolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from detr_peg.data.padding import pad_images


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
    if torch.compiler.is_exporting():
        # ONNX's Resize picks other source pixels for some sizes; index explicitly instead.
        return select_nearest(mask, size)
    return F.interpolate(mask[None].float(), size=tuple(size)).to(torch.bool)[0]


def select_nearest(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """``downsample_mask`` written as two index selections (exact in any runtime).

    Source index ``min(floor(i * (in / out)), in - 1)`` with the scale in
    float32, as PyTorch's legacy ``nearest`` computes it on CPU and GPU.

    Args:
        mask: ``Tensor[B, H, W]`` bool, True = padding.
        size: ``(H_l, W_l)``.

    Returns:
        ``Tensor[B, H_l, W_l]`` bool, True = padding.
    """
    rows = _nearest_source(mask.shape[1], size[0], mask.device)
    cols = _nearest_source(mask.shape[2], size[1], mask.device)
    return mask.index_select(1, rows).index_select(2, cols)


def _nearest_source(in_size, out_size, device: torch.device) -> Tensor:
    scale = torch.full((), in_size, dtype=torch.float32, device=device) / out_size
    index = (torch.arange(out_size, dtype=torch.float32, device=device) * scale).floor().to(torch.int64)
    return index.clamp(max=in_size - 1)


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
