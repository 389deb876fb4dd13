"""Padding masks at feature-map resolution, by one of two rules (``model.mask_rule``).

* ``nearest`` (default, the official DETR and Deformable-DETR rule): feature
  cell ``r`` of a map of ``H_l`` rows samples input row
  ``floor(r * H / H_l)`` of the padded canvas.
* ``stride``: cell ``r`` of a map of stride ``s`` samples input row ``r * s``,
  so it is valid exactly when ``r < ceil(h / s)`` for an image of ``h`` rows,
  the number of rows the image alone has at that level (ResNet convolutions
  pad, so every stride-2 step rounds up).

The two agree whenever the canvas is a multiple of ``s``, which is why the
loaders and :class:`~detr_peg.detector.Detector` pad batches to a multiple of
the model's coarsest stride (``size_divisibility``). On other canvases the
``nearest`` rule marks too many cells valid: a 96 px image on a 120 px canvas
gets 7 valid rows instead of 6 at stride 16 and 4 instead of 3 at stride 32,
so Deformable-DETR's valid ratios, and with them its reference points, are
wrong.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from detr_peg.data.padding import pad_images
from detr_peg.models.argument_checks import check_image_list, check_images


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


def select_strided(mask: Tensor, size: tuple[int, int] | torch.Size, stride: int) -> Tensor:
    """The ``stride`` rule: cell ``(r, c)`` is padding when input pixel ``(r * stride, c * stride)`` is.

    Args:
        mask: ``Tensor[B, H, W]`` bool, True = padding, each image top-left aligned.
        size: ``(H_l, W_l)``, at most ``ceil(H / stride)`` by ``ceil(W / stride)``.
        stride: the level's total stride relative to the input.

    Returns:
        ``Tensor[B, H_l, W_l]`` bool, True = padding.
    """
    rows = _strided_source(mask.shape[1], size[0], stride, mask.device)
    cols = _strided_source(mask.shape[2], size[1], stride, mask.device)
    return mask.index_select(1, rows).index_select(2, cols)


def _strided_source(in_size, out_size, stride: int, device: torch.device) -> Tensor:
    return (torch.arange(out_size, dtype=torch.int64, device=device) * stride).clamp(max=in_size - 1)


#: ``model.mask_rule`` values (see the module docstring).
MASK_RULES = ("nearest", "stride")


def level_masks(mask: Tensor, sizes: list[tuple[int, int]], strides: list[int], rule: str = "nearest") -> list[Tensor]:
    """The padding mask of every feature level.

    Args:
        mask: ``Tensor[B, H, W]`` bool, True = padding.
        sizes: ``(H_l, W_l)`` of each level.
        strides: each level's total stride (used by the ``stride`` rule).
        rule: ``nearest`` or ``stride``.

    Returns:
        ``[Tensor[B, H_l, W_l] bool, ...]``, True = padding.
    """
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
    """Normalise the detector input to a padded batch and its padding mask.

    Args:
        images: ``Tensor[B, 3, H, W]`` (padded batch), or a list of unpadded
            ``Tensor[3, H_i, W_i]`` images (padded here, top-left aligned).
        mask: ``Tensor[B, H, W]`` bool, True = padding; ``None`` means no
            padding for a batch tensor. Must be ``None`` for a list.
        size_divisibility: a list is padded to a multiple of it (the model's
            coarsest stride, so the masks match the feature maps).

    Returns:
        ``(Tensor[B, 3, H, W], Tensor[B, H, W] bool)``.
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
    if mask.shape != (images.shape[0], *images.shape[2:]) or mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool Tensor[B, H, W] matching images {tuple(images.shape)}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return images, mask
