"""The public model API refuses what it cannot use, before computing (Rule 7 of docs/guarantees.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def _tracing() -> bool:
    """While ``torch.compile`` or an export traces, only the checks of shapes and dtypes run."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"{str(value.dtype).replace('torch.', '')} Tensor{list(value.shape)}"
    return type(value).__name__


def check_images(images: Tensor, name: str = "images") -> None:
    """``images`` is a finite floating ``Tensor[B, 3, H, W]`` (not float64), ``B, H, W >= 1``; errors name ``name``."""
    if not isinstance(images, Tensor):
        raise TypeError(f"{name} must be a Tensor[B, 3, H, W] or a list of Tensor[3, H, W], got {_describe(images)}")
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(
            f"{name} must be a batch of images of 3 colour channels, Tensor[B, 3, H, W], got {_describe(images)}"
        )
    if not images.is_floating_point():
        raise TypeError(f"{name} must be floating point (normalised pixels), got {_describe(images)}")
    if images.dtype == torch.float64:
        raise TypeError(f"{name} is float64 but the detectors compute in float32: pass images.float()")
    if _tracing():
        return
    if 0 in images.shape:
        raise ValueError(f"{name} must hold at least one image of at least 1x1 pixel, got {_describe(images)}")
    if not bool(torch.isfinite(images).all()):
        bad = int((~torch.isfinite(images)).sum())
        raise ValueError(f"{name} holds {bad} NaN or infinite values; every pixel must be finite")


def check_mask(mask: Any, like: Tensor, name: str = "mask", padded_batch: bool = False) -> None:
    """``mask`` is a bool ``Tensor[B, H, W]`` (True = padding) of ``like``'s ``[B, *, H, W]``: a uint8 mask would
    invert to 255/254 and count padding as valid. ``padded_batch``: the images' own mask, whose padding is at the
    bottom and right, so the top-left pixel of each image is valid."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (like.shape[0], *like.shape[2:]):
        raise ValueError(f"{name} must be a bool Tensor[B, H, W] matching {tuple(like.shape)}, got {_describe(mask)}")
    if padded_batch and not _tracing() and mask.numel() and bool(mask[:, 0, 0].any()):  # padding: bottom, right
        i = int(mask[:, 0, 0].nonzero()[0])
        raise ValueError(f"{name}[{i}] marks its top-left pixel as padding, but True = padding, added at the bottom and "
                         "right of each image: is the mask inverted, or the image empty?")  # fmt: skip


def check_image_list(images: Sequence[Any], name: str = "images") -> None:
    """A non-empty list of ``Tensor[3, H, W]`` of one dtype, before padding (then :func:`check_images`)."""
    if len(images) == 0:
        raise ValueError(f"{name} is an empty list; pass at least one Tensor[3, H, W]")
    for i, image in enumerate(images):
        if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"{name}[{i}] must be a Tensor[3, H, W], got {_describe(image)}")
    dtypes = {image.dtype for image in images}
    if len(dtypes) > 1:
        raise TypeError(f"{name} mixes dtypes {sorted(str(d).replace('torch.', '') for d in dtypes)}; use one")


def _check_same_batch(outputs: dict, other: Sequence | Tensor, name: str) -> None:
    """``other`` (sizes or targets) counts as many images as ``outputs["pred_logits"]``: never broadcast."""
    logits = outputs.get("pred_logits") if isinstance(outputs, dict) else None
    if not isinstance(logits, Tensor):
        raise TypeError(f"outputs must be the model's output dict with 'pred_logits', got {_describe(outputs)}")
    if not _tracing() and len(other) != logits.shape[0]:
        raise ValueError(f"{name} describes {len(other)} images but the outputs hold {logits.shape[0]}; give one each")


def check_target_sizes(outputs: dict, target_sizes: Any) -> None:
    """``target_sizes`` is ``Tensor[B, 2]`` (h, w) with one row per image of ``outputs``."""
    if not isinstance(target_sizes, Tensor) or target_sizes.dim() != 2 or target_sizes.shape[1] != 2:
        raise ValueError(f"target_sizes must be a Tensor[B, 2] of (height, width), got {_describe(target_sizes)}")
    _check_same_batch(outputs, target_sizes, "target_sizes")
    if not _tracing() and not bool((target_sizes > 0).all()):  # else boxes of zero or negative pixels
        raise ValueError(f"target_sizes must be positive (height, width) in pixels, got {target_sizes.tolist()}")


def check_targets(outputs: dict, targets: Any, num_classes: int) -> None:
    """One target per image: ``labels`` integer ``Tensor[N]`` in ``0..num_classes-1`` (DETR's ``num_classes`` is
    "no object"), ``boxes`` floating ``Tensor[N, 4]``."""
    if not isinstance(targets, (list, tuple)):
        raise TypeError(f"targets must be a list of dicts, one per image, got {_describe(targets)}")
    _check_same_batch(outputs, targets, "targets")
    for i, target in enumerate(targets):
        labels, boxes = (target.get("labels"), target.get("boxes")) if isinstance(target, dict) else (None, None)
        if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.is_floating_point():
            raise ValueError(f"targets[{i}]['labels'] must be an integer Tensor[N], got {_describe(labels)}")
        if not isinstance(boxes, Tensor) or boxes.shape != (labels.shape[0], 4) or not boxes.is_floating_point():
            raise ValueError(
                f"targets[{i}]['boxes'] must be a floating Tensor[{labels.shape[0]}, 4] of normalised "
                f"(cx, cy, w, h), got {_describe(boxes)}"
            )
    known = [((t["labels"] >= 0) & (t["labels"] < num_classes)).all() for t in targets]
    normalised = [((t["boxes"] >= -1e-4) & (t["boxes"] <= 1 + 1e-4)).all() for t in targets]  # (cx, cy, w, h)
    if targets and not _tracing() and not bool(torch.stack(known + normalised).all()):  # one host sync
        bad = next(i for i, inside in enumerate(known + normalised) if not inside)
        i = bad % len(targets)
        if bad < len(targets):
            raise ValueError(f"targets[{i}]['labels'] must lie in 0..{num_classes - 1} (num_classes {num_classes}), "
                             f"got {targets[i]['labels'].tolist()}")  # fmt: skip
        raise ValueError(f"targets[{i}]['boxes'] must be normalised (cx, cy, w, h), each from 0 to 1 (w, h >= 0), got "
                         f"{targets[i]['boxes'].tolist()[:3]}")  # fmt: skip
