"""The one inference loop: padded batches in, float32 outputs and post-processed detections out.

Every caller that runs a trained model over images uses :func:`run_inference`:
COCO evaluation, multi-resolution evaluation, the padding comparison,
:class:`detr_peg.Detector` (and so ``detr-peg predict`` and the demo). It
puts the model in eval mode, runs each batch under the run's autocast,
checks the outputs are finite (a clear error naming the fix, not NaN boxes),
casts them to float32 and post-processes them with each image's original size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from detr_peg.checkpoint.weights_check import check_outputs
from detr_peg.engine.loader import iterate_batches
from detr_peg.engine.mixed_precision import autocast, outputs_to_float
from detr_peg.models.loading import LoadedModel


@dataclass
class BatchResult:
    """What the model made of one batch.

    Attributes:
        items: the batch's per-image items, as the batches gave them (targets
            with at least ``orig_size`` ``Tensor[2]`` (h, w)).
        outputs: the model's output dict in float32 on the model's device
            (``pred_logits`` ``Tensor[B, Q, C]``, ``pred_boxes`` ``Tensor[B, Q, 4]``
            normalised cx, cy, w, h relative to each unpadded image, ...).
        detections: per image ``{"scores": Tensor[N], "labels": Tensor[N],
            "boxes": Tensor[N, 4]}``, boxes in absolute (x0, y0, x1, y1) pixels
            of the original image.
        padded_pixels: how many pixels of the batch were padding.
        total_pixels: all pixels of the batch.
    """

    items: list[dict[str, Any]]
    outputs: dict[str, Any]
    detections: list[dict[str, Tensor]]
    padded_pixels: int
    total_pixels: int


Batches = Iterable[tuple[Tensor, Tensor, list[dict[str, Any]]]]


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
    """Run ``loaded`` over ``batches`` and yield each batch's outputs and detections, in order.

    Args:
        loaded: the model and its post-processor.
        batches: ``(images Tensor[B, 3, H, W], mask Tensor[B, H, W] bool (True =
            padding), items)``, e.g. an evaluation loader; each item has
            ``orig_size`` (h, w).
        device: where the model is.
        amp: the resolved autocast (``none``, ``bf16`` or ``fp16``).
        pad: changes each batch before the forward pass (the padding
            comparison grows batches with it), or None.
        on_batch: called with the number of images after each batch (progress).

    Raises:
        UserError: non-finite outputs, or a bad sample the loader reports.
    """
    loaded.model.eval()
    iterator = iterate_batches(batches)
    try:
        for images, mask, items in iterator:
            if pad is not None:
                images, mask = pad(images, mask)
            with autocast(amp, device):
                outputs = loaded.model(images.to(device, non_blocking=True), mask.to(device, non_blocking=True))
            check_outputs(outputs)
            outputs = outputs_to_float(outputs)
            sizes = torch.stack([torch.as_tensor(item["orig_size"]) for item in items]).to(device)
            detections = loaded.postprocessor(outputs, sizes)
            yield BatchResult(items, outputs, detections, int(mask.sum()), mask.numel())
            if on_batch is not None:
                on_batch(len(items))
    finally:
        iterator.close()
