"""The one inference loop: padded batches in, float32 outputs and post-processed detections out.

Evaluation, the padding comparison and :class:`detr_peg.Detector` all use :func:`run_inference`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from detr_peg.checkpoint.weights_check import check_outputs
from detr_peg.engine.mixed_precision import autocast, outputs_to_float
from detr_peg.errors import ConfigError
from detr_peg.models.loading import LoadedModel


@dataclass
class BatchResult:
    """One batch: its ``items`` (targets with ``orig_size`` (h, w)), the float32 ``outputs`` and the ``detections``.

    ``outputs["pred_boxes"]`` is ``[B, Q, 4]`` cxcywh normalised to each unpadded image; ``detections`` per image
    ``{"scores" [N], "labels" [N], "boxes" [N, 4]}``, boxes xyxy in pixels of the original image.
    """

    items: list[dict[str, Any]]
    outputs: dict[str, Any]
    detections: list[dict[str, Tensor]]
    padded_pixels: int
    total_pixels: int


Batches = Iterable[tuple[Tensor, Tensor, list[dict[str, Any]]]]


def forward(model: torch.nn.Module, images: Tensor, mask: Tensor) -> Any:
    """``model(images, mask)``, with :func:`too_small_for_norm` for its ValueError."""
    try:
        return model(images, mask)
    except ValueError as exc:
        too_small_for_norm(exc, images)
        raise


def too_small_for_norm(exc: ValueError, images: Tensor) -> None:
    """Raise a ConfigError naming what to change when ``exc`` is torch refusing a normalisation over one value per
    channel or group (BatchNorm in training, GroupNorm always) on 1 x 1 feature maps; else return."""
    if "Expected more than 1 value per channel" in str(exc):
        raise ConfigError(
            f"A batch of {len(images)} image(s) of {images.shape[-2]} x {images.shape[-1]} pixels gives feature maps "
            f"of 1 x 1, too small for the model's normalisation ({exc}); raise the image sizes (data.train_scales, "
            "data.val_scale), or for trainable BatchNorm train.batch_size or model.backbone.norm=frozen_bn, or for "
            "Deformable-DETR's GroupNorm (32 groups) model.transformer.hidden_dim to 64 or more."
        ) from None


@torch.no_grad()
def run_inference(
    loaded: LoadedModel,
    batches: Batches,
    *,
    device: torch.device,
    amp: str = "none",
    pad: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[BatchResult]:
    """Run ``loaded`` in eval mode over ``batches``, yielding each batch's :class:`BatchResult` in order.

    ``batches`` (a loader wrapped in :func:`~detr_peg.engine.loader.iterate_batches`, or any iterable) yield
    ``(images [B, 3, H, W], mask [B, H, W] bool True = padding, items)``; ``amp`` is resolved;
    ``pad`` changes a batch before the forward pass; ``on_batch`` gets each batch's image count.

    Raises:
        UserError: non-finite outputs, or a bad sample the loader reports.
    """
    loaded.model.eval()
    iterator = iter(batches)
    try:
        for images, mask, items in iterator:
            if pad is not None:
                images, mask = pad(images, mask)
            images, mask = images.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            if amp == "none":
                outputs = forward(loaded.model, images, mask)
            else:
                with autocast(amp, device):
                    outputs = outputs_to_float(forward(loaded.model, images, mask))
            check_outputs(outputs)
            sizes = torch.stack([torch.as_tensor(item["orig_size"]) for item in items]).to(device)
            detections = loaded.postprocessor(outputs, sizes)
            yield BatchResult(items, outputs, detections, int(mask.sum()), mask.numel())
            if on_batch is not None:
                on_batch(len(items))
    finally:
        if hasattr(iterator, "close"):  # a loader's iterator: its worker processes stop now
            iterator.close()
