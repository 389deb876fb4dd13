"""Turning model outputs into scored, labelled boxes in image pixels."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert


def _scale_boxes(boxes_cxcywh: Tensor, target_sizes: Tensor) -> Tensor:
    """Normalised (cx, cy, w, h) ``[B, Q, 4]`` -> absolute (x0, y0, x1, y1) for sizes ``[B, 2]`` (h, w)."""
    boxes = box_convert(boxes_cxcywh, "cxcywh", "xyxy")
    h, w = target_sizes.unbind(1)
    scale = torch.stack([w, h, w, h], dim=1).to(boxes.dtype)
    return boxes * scale[:, None, :]


class PostProcess(nn.Module):
    """DETR post-processing: one detection per query, "no object" excluded.

    For each query the score is the largest softmax probability among the
    real classes and the label is its index.
    """

    @torch.no_grad()
    def forward(self, outputs: dict, target_sizes: Tensor) -> list[dict[str, Tensor]]:
        """Convert outputs to detections.

        Args:
            outputs: ``pred_logits`` ``Tensor[B, Q, K + 1]``, ``pred_boxes``
                ``Tensor[B, Q, 4]`` normalised (cx, cy, w, h).
            target_sizes: ``Tensor[B, 2]`` (h, w) of each original image.

        Returns:
            Per image ``{"scores": Tensor[Q], "labels": Tensor[Q] int64,
            "boxes": Tensor[Q, 4]}`` with absolute (x0, y0, x1, y1) pixel boxes.
        """
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        scores, labels = logits.softmax(-1)[..., :-1].max(-1)
        boxes = _scale_boxes(boxes, target_sizes)
        return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]


class TopKPostProcess(nn.Module):
    """Deformable-DETR post-processing: the top-k (query, class) pairs by sigmoid score.

    Args:
        num_select: detections kept per image (capped at ``Q * K``).
    """

    def __init__(self, num_select: int = 100) -> None:
        super().__init__()
        self.num_select = num_select

    @torch.no_grad()
    def forward(self, outputs: dict, target_sizes: Tensor) -> list[dict[str, Tensor]]:
        """Same contract as :class:`PostProcess`, with ``num_select`` detections per image."""
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        b, q, k = logits.shape
        scores, flat = torch.topk(logits.sigmoid().view(b, -1), min(self.num_select, q * k), dim=1)
        query = flat // k
        labels = flat % k
        boxes = _scale_boxes(boxes, target_sizes)
        boxes = torch.gather(boxes, 1, query.unsqueeze(-1).expand(-1, -1, 4))
        return [{"scores": s, "labels": l, "boxes": x} for s, l, x in zip(scores, labels, boxes)]
