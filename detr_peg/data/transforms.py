"""Box-aware augmentation for detection, built on ``torchvision.transforms.v2``.

Every transform here is called as ``image, target = transform(image, target)``
where, on input:

* ``image`` is a ``tv_tensors.Image`` ``uint8[3, H, W]`` (RGB);
* ``target["boxes"]`` is a ``tv_tensors.BoundingBoxes`` ``float32[N, 4]`` in
  absolute pixel ``XYXY`` with ``canvas_size == (H, W)``;
* ``target["labels"]`` is ``int64[N]``; other per-box tensors (``area``,
  ``iscrowd``) are filtered along with the boxes; all other keys pass through.

The pipelines built by :func:`build_train_transforms` and
:func:`build_eval_transforms` end with plain tensors: the image
``float32[3, H', W']`` normalised with the ImageNet mean and std, and
``target["boxes"]`` ``float32[N', 4]`` as **normalized (cx, cy, w, h) relative
to the unpadded transformed image**, the format DETR predicts.

Short-side resizing follows torchvision's ``Resize(size, max_size)`` rule: the
short side becomes ``size`` unless the long side would exceed ``max_size``, in
which case the long side becomes exactly ``max_size``; unlike torchvision,
no side becomes less than 1 pixel (:func:`resized_size`), so an image whose
long side is more than ``max_size`` times its short side (a 1 x 150 px
strip with ``max_size`` 96) is resized to 1 x 96 px, not refused with an
error from the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.ops import box_convert
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from detr_peg.config.ranges import field_range
from detr_peg.config.schema import DataConfig
from detr_peg.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Target keys holding one value per box, kept in step with the boxes when boxes are dropped.
PER_BOX_KEYS = ("labels", "area", "iscrowd")


class RandomSizeCrop(v2.Transform):
    """Crop a random region of random size (DETR's ``RandomSizeCrop``).

    The crop height and width are drawn independently and uniformly from
    ``[min_size, min(side, max_size)]`` (integers, both ends included), then the
    crop position uniformly among those that fit. If a side is shorter than
    ``min_size`` that side is kept whole. Boxes are shifted and clamped to the
    crop; boxes left empty must be removed afterwards (``SanitizeBoundingBoxes``).

    Args:
        min_size: smallest crop side in pixels.
        max_size: largest crop side in pixels.
    """

    def __init__(self, min_size: int, max_size: int):
        super().__init__()
        if not 0 < min_size <= max_size:
            raise ValueError(f"RandomSizeCrop needs 0 < min_size <= max_size, got {min_size}, {max_size}")
        self.min_size = int(min_size)
        self.max_size = int(max_size)

    def _draw_side(self, side: int) -> int:
        low = min(self.min_size, side)
        high = min(self.max_size, side)
        return int(torch.randint(low, high + 1, ()))

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        crop_h = self._draw_side(height)
        crop_w = self._draw_side(width)
        top = int(torch.randint(0, height - crop_h + 1, ()))
        left = int(torch.randint(0, width - crop_w + 1, ()))
        return dict(top=top, left=left, height=crop_h, width=crop_w)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


class BoxesToNormalizedCxcywh(v2.Transform):
    """Turn ``BoundingBoxes`` into plain normalized ``(cx, cy, w, h)`` tensors.

    ``BoundingBoxes[N, 4]`` of any axis-aligned format with ``canvas_size ==
    (H, W)`` become a plain ``float32[N, 4]`` tensor of ``(cx / W, cy / H,
    w / W, h / H)``. Must come after every geometric transform.
    """

    _transformed_types = (tv_tensors.BoundingBoxes,)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        height, width = inpt.canvas_size
        xyxy = F.convert_bounding_box_format(inpt, new_format=tv_tensors.BoundingBoxFormat.XYXY)
        boxes = box_convert(xyxy.as_subclass(Tensor).float(), in_fmt="xyxy", out_fmt="cxcywh")
        return boxes / torch.tensor([width, height, width, height], dtype=boxes.dtype, device=boxes.device)


def _per_box_fields(inputs: Any) -> tuple[Tensor, ...]:
    """``labels_getter`` for ``SanitizeBoundingBoxes``: every per-box tensor of the target."""
    candidates = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    for candidate in candidates:
        if isinstance(candidate, dict):
            return tuple(candidate[key] for key in PER_BOX_KEYS if key in candidate)
    return ()


def sanitize_boxes() -> v2.SanitizeBoundingBoxes:
    """Drop boxes narrower, shorter or smaller in area than one pixel, with their labels."""
    return v2.SanitizeBoundingBoxes(min_size=1.0, min_area=1.0, labels_getter=_per_box_fields)


def resized_size(height: int, width: int, short: int, max_size: int | None) -> tuple[int, int]:
    """``(H', W')`` of the short-side resize of an ``height x width`` image, each side at least 1 pixel.

    torchvision's ``Resize([short], max_size)`` rule, sides truncated to whole
    pixels: the short side becomes ``short`` and the long side keeps the
    aspect ratio, unless that passes ``max_size``, which then becomes the long
    side (the short side scaled with it). A ``short`` of at least ``max_size``
    resizes the long side to ``max_size`` (torchvision's ``Resize(None,
    max_size)``). A side that the rule would truncate to 0 becomes 1
    (torchvision's kernel refuses 0): an image whose long side is more than
    ``max_size`` times its short side.

    Args:
        height: image height in pixels.
        width: image width in pixels.
        short: the short side asked for, in pixels.
        max_size: cap on the long side, or ``None``.
    """
    small, large = sorted((height, width))
    if max_size is not None and short >= max_size:
        new_small, new_large = int(max_size * small / large), max_size
    else:
        new_small, new_large = short, int(short * large / small)
        if max_size is not None and new_large > max_size:
            new_small, new_large = int(max_size * new_small / new_large), max_size
    new_small, new_large = max(1, new_small), max(1, new_large)
    return (new_small, new_large) if height <= width else (new_large, new_small)


class ShortSideResize(v2.Transform):
    """Resize so the short side is ``short``, the long side at most ``max_size`` (:func:`resized_size`).

    Images with antialiasing, boxes with them. Draws no random number.

    Args:
        short: the short side in pixels.
        max_size: cap on the long side (``None``: no cap).
    """

    def __init__(self, short: int, max_size: int | None = None):
        super().__init__()
        if short < 1 or (max_size is not None and max_size < 1):
            raise ValueError(f"ShortSideResize needs sizes of at least 1 px, got short={short}, max_size={max_size}")
        self.short = int(short)
        self.max_size = max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        return {"size": list(resized_size(*v2.query_size(flat_inputs), self.short, self.max_size))}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.resize, inpt, params["size"], antialias=True)


def short_side_resize(scales: Sequence[int], max_size: int | None = None) -> v2.Transform:
    """Resize so the short side is a random choice of ``scales``, the long side at most ``max_size``.

    Args:
        scales: candidate short-side lengths in pixels, drawn uniformly
            (``v2.RandomChoice``) among :class:`ShortSideResize` steps.
        max_size: cap on the long side (``None``: no cap). A scale ``>=
            max_size`` resizes the long side to ``max_size``.

    ``v2.RandomShortestSize`` is not used because it sizes both sides as
    ``int(side * ratio)``, which can fall one pixel short of the requested short
    side (a 103 px side asked to become 128 becomes 127).
    """
    choices = [ShortSideResize(int(s), max_size) for s in scales]
    return choices[0] if len(choices) == 1 else v2.RandomChoice(choices)


def _to_model_input() -> list[v2.Transform]:
    return [
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)),
        BoxesToNormalizedCxcywh(),
        v2.ToPureTensor(),
    ]


def _check_sizes(name: str, given: Any) -> list[int]:
    """The sizes of ``data.<name>`` as a list, checked against the field's range in the schema."""
    values = list(given) if isinstance(given, (list, tuple)) else [given]
    allowed = field_range(DataConfig.__dataclass_fields__[name].metadata)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v in allowed for v in values):
        raise ConfigError(f"data.{name} is {given!r}; it must hold whole numbers of pixels {allowed.describe()}.")
    return values


def _check_probability(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"data.{name} is {value!r}; it must be a probability between 0 and 1.")
    return float(value)


def build_train_transforms(cfg: DataConfig) -> v2.Compose:
    """The DETR training augmentation.

    Steps: horizontal flip with probability ``cfg.hflip_prob``; then either
    (probability ``1 - cfg.crop_prob``) a short-side resize to a random choice
    of ``cfg.train_scales`` capped at ``cfg.train_max_size``, or (probability
    ``cfg.crop_prob``) a short-side resize to a random choice of
    ``cfg.crop_scales``, a :class:`RandomSizeCrop` with sides in
    ``cfg.crop_size``, removal of boxes left with less than one pixel of width,
    height or area, and the same random resize as the other branch; finally
    conversion to the model input (see the module docstring). With
    ``cfg.train_size_per == "batch"`` the resize to ``train_scales`` is left
    out (both branches): the sampler draws one size per batch and
    :func:`resize_sample` applies it.

    Raises:
        ConfigError: a size list is empty or outside its range in the schema
            (sizes of at least 2 px, ``crop_size`` of at least 1), ``crop_size`` is not
            ``[min, max]`` with ``min <= max``, or a probability is outside [0, 1].
    """
    train_scales = _check_sizes("train_scales", cfg.train_scales)
    train_max = _check_sizes("train_max_size", cfg.train_max_size)[0]
    crop_prob = _check_probability("crop_prob", cfg.crop_prob)
    hflip_prob = _check_probability("hflip_prob", cfg.hflip_prob)
    # With one size per batch the sampler draws it and the sample is resized after this pipeline
    # (resize_sample); the crop branch keeps its own resize before the crop.
    resize = short_side_resize(train_scales, train_max) if cfg.train_size_per == "image" else v2.Identity()
    steps: list[v2.Transform] = []
    if hflip_prob > 0:
        steps.append(v2.RandomHorizontalFlip(p=hflip_prob))
    if crop_prob > 0:
        crop_scales = _check_sizes("crop_scales", cfg.crop_scales)
        crop_size = _check_sizes("crop_size", cfg.crop_size)
        if len(crop_size) != 2 or crop_size[0] > crop_size[1]:
            raise ConfigError(f"data.crop_size is {crop_size!r}; it must be [min, max] with min <= max.")
        crop_branch = v2.Compose([short_side_resize(crop_scales), RandomSizeCrop(*crop_size), sanitize_boxes(), resize])
        if crop_prob < 1:
            crop_branch = v2.RandomChoice([resize, crop_branch], p=[1 - crop_prob, crop_prob])
        steps.append(crop_branch)
    else:
        steps.append(resize)
    return v2.Compose(steps + _to_model_input())


def resize_sample(image: Tensor, target: dict[str, Any], short: int, max_size: int | None) -> tuple[Tensor, dict]:
    """Resize a model-ready sample (the end of the training pipeline) to short side ``short``, long side at most ``max_size``.

    The size rule is :func:`resized_size`. Boxes are normalized
    ``(cx, cy, w, h)`` relative to the image, so they do not change;
    ``target["size"]`` becomes the new ``(h, w)``.

    Args:
        image: ``float32[3, H, W]``, normalised.
        target: its target (``boxes`` normalized cxcywh, ``size``).
        short: the short side in pixels.
        max_size: cap on the long side, or None.

    Returns:
        ``(image, target)``: ``float32[3, H', W']`` and a new target dict.
    """
    resized = F.resize(image, list(resized_size(*image.shape[-2:], int(short), max_size)), antialias=True)
    return resized, {**target, "size": torch.tensor(list(resized.shape[-2:]), dtype=torch.int64)}


def build_eval_transforms(cfg: DataConfig) -> v2.Compose:
    """The evaluation transform: short side ``cfg.val_scale``, long side at most ``cfg.val_max_size``.

    No box is dropped, so the targets keep every non-crowd, non-degenerate
    annotation. Ends with conversion to the model input (see the module
    docstring).

    Raises:
        ConfigError: ``val_scale`` or ``val_max_size`` is not a whole number of at least 2 px.
    """
    scale = _check_sizes("val_scale", cfg.val_scale)[0]
    max_size = _check_sizes("val_max_size", cfg.val_max_size)[0]
    return v2.Compose([short_side_resize([scale], max_size)] + _to_model_input())
