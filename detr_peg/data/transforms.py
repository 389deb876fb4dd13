"""Box-aware detection augmentation on ``torchvision.transforms.v2``: ``image, target = t(image, target)``.

Input: RGB ``uint8[3, H, W]``, pixel XYXY ``BoundingBoxes`` and per-box ``labels``/``area``/``iscrowd``. The built
pipelines output ImageNet-normalised ``float32[3, H', W']`` and ``boxes`` normalised cxcywh of the unpadded image.
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

from detr_peg.config.ranges import is_number, is_whole
from detr_peg.config.schema import DataConfig
from detr_peg.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Target keys holding one value per box, kept in step with the boxes when boxes are dropped.
PER_BOX_KEYS = ("labels", "area", "iscrowd")


class RandomSizeCrop(v2.Transform):
    """Crop a random region whose sides are drawn uniformly from ``[min_size, min(side, max_size)]`` (DETR's).

    A side shorter than ``min_size`` is kept whole. Boxes are shifted and clamped, not dropped: follow with
    :func:`sanitize_boxes`.
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
    """``BoundingBoxes[N, 4]`` (any format, canvas ``(H, W)``) to plain ``float32[N, 4]`` cxcywh over ``(W, H, W, H)``.

    Must come after every geometric transform.
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
    """``(H', W')`` of torchvision's ``Resize([short], max_size)`` rule, sides truncated, each at least 1 pixel.

    ``short >= max_size`` resizes the long side to ``max_size``. The 1-pixel floor keeps extreme aspect ratios
    (long side over ``max_size`` times the short one) from reaching torchvision's kernel, which refuses 0.
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
    """Resize (antialiased, boxes too) to :func:`resized_size` of ``short``, ``max_size``; draws no random number."""

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
    """Resize to a short side drawn uniformly from ``scales``, long side at most ``max_size`` (:func:`resized_size`).

    Not ``v2.RandomShortestSize``: it can land one pixel short of the requested short side.
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
    allowed = DataConfig.__dataclass_fields__[name].metadata["range"]
    if not values or not all(is_whole(v) and v in allowed for v in values):
        raise ConfigError(f"data.{name} is {given!r}; it must hold whole numbers of pixels {allowed.describe()}.")
    return values


def _check_probability(name: str, value: Any) -> float:
    if not is_number(value) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"data.{name} is {value!r}; it must be a probability between 0 and 1.")
    return float(value)


def build_train_transforms(cfg: DataConfig) -> v2.Compose:
    """The DETR training augmentation: flip, then resize or (``crop_prob``) resize-crop-sanitize-resize.

    With ``cfg.train_size_per == "batch"`` the ``train_scales`` resize is left out: the sampler draws one size per
    batch and :func:`resize_sample` applies it. Raises ``ConfigError`` for a size list empty or out of its schema
    range, a ``crop_size`` other than ``[min, max]``, or a probability outside [0, 1].
    """
    train_scales = _check_sizes("train_scales", cfg.train_scales)
    train_max = _check_sizes("train_max_size", cfg.train_max_size)[0]
    crop_prob = _check_probability("crop_prob", cfg.crop_prob)
    hflip_prob = _check_probability("hflip_prob", cfg.hflip_prob)
    crop_scales, crop_size = _check_sizes("crop_scales", cfg.crop_scales), _check_sizes("crop_size", cfg.crop_size)
    if len(crop_size) != 2 or crop_size[0] > crop_size[1]:  # checked when unused too: the config says one thing
        raise ConfigError(f"data.crop_size is {crop_size!r}; it must be [min, max] with min <= max.")
    # With one size per batch the sampler draws it and the sample is resized after this pipeline
    # (resize_sample); the crop branch keeps its own resize before the crop.
    resize = short_side_resize(train_scales, train_max) if cfg.train_size_per == "image" else v2.Identity()
    steps: list[v2.Transform] = []
    if hflip_prob > 0:
        steps.append(v2.RandomHorizontalFlip(p=hflip_prob))
    if crop_prob > 0:
        crop_branch = v2.Compose([short_side_resize(crop_scales), RandomSizeCrop(*crop_size), sanitize_boxes(), resize])
        if crop_prob < 1:
            crop_branch = v2.RandomChoice([resize, crop_branch], p=[1 - crop_prob, crop_prob])
        steps.append(crop_branch)
    else:
        steps.append(resize)
    return v2.Compose(steps + _to_model_input())


def resize_sample(image: Tensor, target: dict[str, Any], short: int, max_size: int | None) -> tuple[Tensor, dict]:
    """Resize a model-ready ``float32[3, H, W]`` sample to :func:`resized_size`; returns a new target.

    Boxes are normalised cxcywh and stay as they are; ``target["size"]`` becomes the new ``(h, w)``.
    """
    resized = F.resize(image, list(resized_size(*image.shape[-2:], int(short), max_size)), antialias=True)
    return resized, {**target, "size": torch.tensor(list(resized.shape[-2:]), dtype=torch.int64)}


def build_eval_transforms(cfg: DataConfig) -> v2.Compose:
    """Resize to short side ``val_scale``, long side at most ``val_max_size``; ``ConfigError`` if out of range."""
    scale = _check_sizes("val_scale", cfg.val_scale)[0]
    max_size = _check_sizes("val_max_size", cfg.val_max_size)[0]
    return v2.Compose([short_side_resize([scale], max_size)] + _to_model_input())
