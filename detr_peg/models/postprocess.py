"""Model outputs to scored, labelled pixel boxes: one post-processor per architecture, whose batched
:meth:`Postprocessor.tensors` the exported ONNX graph computes too.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert

from detr_peg.models.argument_checks import check_target_sizes


def scale_boxes(boxes_cxcywh: Tensor, target_sizes: Tensor) -> Tensor:
    """Normalised cxcywh ``[B, Q, 4]`` -> absolute pixel xyxy for sizes ``[B, 2]`` (h, w)."""
    boxes = box_convert(boxes_cxcywh, "cxcywh", "xyxy")
    h, w = target_sizes.unbind(1)
    scale = torch.stack([w, h, w, h], dim=1).to(boxes.dtype)
    return boxes * scale[:, None, :]


class Postprocessor(nn.Module):
    """Batched tensors in, detections out; subclasses implement :meth:`tensors`, traceable by ``torch.export``."""

    def tensors(self, logits: Tensor, boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Detections of a batch.

        ``logits`` ``[B, Q, C]``; ``boxes`` ``[B, Q, 4]`` normalised cxcywh relative to each unpadded image;
        ``target_sizes`` ``[B, 2]`` (h, w) pixels of each original image. Returns
        ``(scores [B, N], labels [B, N] int64, boxes [B, N, 4])``, boxes as pixel xyxy, ``N`` per architecture.
        """
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, outputs: dict, target_sizes: Tensor) -> list[dict[str, Tensor]]:
        """Per image ``{"scores": [N], "labels": [N] int64, "boxes": [N, 4] pixel xyxy}``; sizes ``[B, 2]`` (h, w)."""
        check_target_sizes(outputs, target_sizes)
        scores, labels, boxes = self.tensors(outputs["pred_logits"], outputs["pred_boxes"], target_sizes)
        return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]


class PostProcess(Postprocessor):
    """DETR: one detection per query (``N = Q``), the best softmax probability among real classes (last = no object)."""

    def tensors(self, logits: Tensor, boxes: Tensor, target_sizes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """See :meth:`Postprocessor.tensors`."""
        scores, labels = logits.softmax(-1)[..., :-1].max(-1)
        return scores, labels, scale_boxes(boxes, target_sizes)


class TopKPostProcess(Postprocessor):
    """Deformable-DETR: the top ``N = min(num_select, Q * K)`` (query, class) pairs by sigmoid score."""

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
