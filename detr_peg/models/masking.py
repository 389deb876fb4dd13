"""Padding masks (True = padding) at feature-map resolution, by ``model.mask_rule``: ``nearest`` (official:
cell ``r`` samples input row ``floor(r * H / H_l)``) or ``stride`` (cell ``r`` samples row ``r * s``).
They agree when the canvas is a multiple of the stride, hence ``size_divisibility`` padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from detr_peg.data.padding import pad_images
from detr_peg.models.argument_checks import check_image_list, check_images, check_mask


def downsample_mask(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """``[B, H, W]`` padding mask -> ``[B, H_l, W_l]`` by the official legacy ``nearest`` interpolation."""
    if torch.compiler.is_exporting():
        # ONNX's Resize picks other source pixels for some sizes; index explicitly instead.
        return select_nearest(mask, size)
    return F.interpolate(mask[None].float(), size=tuple(size)).to(torch.bool)[0]


def select_nearest(mask: Tensor, size: tuple[int, int] | torch.Size) -> Tensor:
    """:func:`downsample_mask` as two index selections, exact in any runtime (ONNX's Resize is not)."""
    rows = _nearest_source(mask.shape[1], size[0], mask.device)
    cols = _nearest_source(mask.shape[2], size[1], mask.device)
    return mask.index_select(1, rows).index_select(2, cols)


def select_strided(mask: Tensor, size: tuple[int, int] | torch.Size, stride: int) -> Tensor:
    """The ``stride`` rule: cell ``(r, c)`` is padding when input pixel ``(r * stride, c * stride)`` is."""
    rows = _strided_source(mask.shape[1], size[0], stride, mask.device)
    cols = _strided_source(mask.shape[2], size[1], stride, mask.device)
    return mask.index_select(1, rows).index_select(2, cols)


def _strided_source(in_size, out_size, stride: int, device: torch.device) -> Tensor:
    return (torch.arange(out_size, dtype=torch.int64, device=device) * stride).clamp(max=in_size - 1)


#: ``model.mask_rule`` values (see the module docstring).
MASK_RULES = ("nearest", "stride")


def level_masks(mask: Tensor, sizes: list[tuple[int, int]], strides: list[int], rule: str = "nearest") -> list[Tensor]:
    """The ``[B, H_l, W_l]`` bool padding mask of every level by ``rule``; raises ValueError for an unknown rule."""
    if rule == "nearest":
        return [downsample_mask(mask, size) for size in sizes]
    if rule == "stride":
        return [select_strided(mask, size, stride) for size, stride in zip(sizes, strides)]
    raise ValueError(f"mask rule {rule!r} is not one of {', '.join(MASK_RULES)}")


def _nearest_source(in_size, out_size, device: torch.device) -> Tensor:
    scale = torch.full((), in_size, dtype=torch.float32, device=device) / out_size
    index = (torch.arange(out_size, dtype=torch.float32, device=device) * scale).floor().to(torch.int64)
    return index.clamp(max=in_size - 1)


def batch_with_mask(images, mask: Tensor | None = None, size_divisibility: int = 0) -> tuple[Tensor, Tensor]:
    """Normalise the detector input to ``(Tensor[B, 3, H, W], Tensor[B, H, W] bool, True = padding)``.

    ``images`` is a padded batch (``mask`` None = no padding) or a list of unpadded ``[3, H_i, W_i]``
    images, padded here top-left to a multiple of ``size_divisibility`` (``mask`` must then be None).
    Raises ValueError for a mask that does not match.
    """
    if isinstance(images, (list, tuple)):
        if mask is not None:
            raise ValueError("pass either a list of unpadded images or a batch tensor with its mask, not both")
        check_image_list(images)
        batch, mask = pad_images(images, size_divisibility=size_divisibility)
        check_images(batch)
        return batch, mask
    check_images(images)
    if mask is None:
        b, _, h, w = images.shape
        return images, torch.zeros((b, h, w), dtype=torch.bool, device=images.device)
    check_mask(mask, images, padded_batch=True)
    return images, mask
