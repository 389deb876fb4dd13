"""Turning model outputs into scored, labelled boxes in image pixels: one post-processor per architecture.

Each post-processor has one batched tensor method, :meth:`Postprocessor.tensors`,
which the exported ONNX graph computes too; ``forward`` splits its result
into per-image dicts for Python callers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

from detr_peg.models.argument_checks import check_target_sizes


def scale_boxes(boxes_cxcywh: Tensor, target_sizes: Tensor) -> Tensor:
    """Normalised (cx, cy, w, h) ``[B, Q, 4]`` -> absolute (x0, y0, x1, y1) for sizes ``[B, 2]`` (h, w)."""
    boxes = box_convert(boxes_cxcywh, "cxcywh", "xyxy")
    h, w = target_sizes.unbind(1)
    scale = torch.stack([w, h, w, h], dim=1).to(boxes.dtype)
    return boxes * scale[:, None, :]


class Postprocessor(nn.Module):
    """The contract of a post-processor: batched tensors in, batched detections out.

    Subclasses implement :meth:`tensors`; it must be traceable by
    ``torch.export`` (the ONNX graph's ``scores``, ``labels`` and ``boxes``).
    """

    def tensors(self, logits: Tensor, boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Detections of a batch.

        Args:
            logits: ``pred_logits`` ``Tensor[B, Q, C]`` of the architecture.
            boxes: ``pred_boxes`` ``Tensor[B, Q, 4]``, normalised (cx, cy, w, h)
                relative to each unpadded image.
            target_sizes: ``Tensor[B, 2]`` (h, w) of each original image, in pixels.

        Returns:
            ``(scores Tensor[B, N], labels Tensor[B, N] int64, boxes Tensor[B, N, 4])``
            with absolute (x0, y0, x1, y1) pixel boxes, ``N`` per architecture.
        """
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, outputs: dict, target_sizes: Tensor) -> list[dict[str, Tensor]]:
        """Per-image detections.

        Args:
            outputs: the model's output dict (``pred_logits``, ``pred_boxes``).
            target_sizes: ``Tensor[B, 2]`` (h, w) of each original image.

        Returns:
            Per image ``{"scores": Tensor[N], "labels": Tensor[N] int64,
            "boxes": Tensor[N, 4]}`` with absolute (x0, y0, x1, y1) pixel boxes.
        """
        check_target_sizes(outputs, target_sizes)
        scores, labels, boxes = self.tensors(outputs["pred_logits"], outputs["pred_boxes"], target_sizes)
        return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]


class PostProcess(Postprocessor):
    """DETR post-processing: one detection per query (``N = Q``), "no object" excluded.

    For each query the score is the largest softmax probability among the
    real classes (``logits`` ``Tensor[B, Q, K + 1]``, last = no object) and
    the label is its index.
    """

    def tensors(self, logits: Tensor, boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """See :meth:`Postprocessor.tensors`."""
        scores, labels = logits.softmax(-1)[..., :-1].max(-1)
        return scores, labels, scale_boxes(boxes, target_sizes)


class TopKPostProcess(Postprocessor):
    """Deformable-DETR post-processing: the top-k (query, class) pairs by sigmoid score.

    ``logits`` are ``Tensor[B, Q, K]`` sigmoid logits; ``N = min(num_select, Q * K)``.

    Args:
        num_select: detections kept per image.
    """

    def __init__(self, num_select: int = 100) -> None:
        super().__init__()
        self.num_select = num_select

    def tensors(self, logits: Tensor, boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """See :meth:`Postprocessor.tensors`."""
        b, q, k = logits.shape
        scores, flat = torch.topk(logits.sigmoid().reshape(b, q * k), min(self.num_select, q * k), dim=1)
        query = flat // k
        pixel_boxes = torch.gather(scale_boxes(boxes, target_sizes), 1, query.unsqueeze(-1).expand(-1, -1, 4))
        return scores, flat % k, pixel_boxes
