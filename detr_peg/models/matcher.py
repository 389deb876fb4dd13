"""Hungarian matching between predictions and ground-truth boxes."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou

from detr_peg.errors import ConfigError

Indices = list[tuple[Tensor, Tensor]]


class HungarianMatcher(nn.Module):
    """One-to-one query-target assignment minimising ``cost_class * C_cls + cost_bbox * L1 - cost_giou * GIoU``.

    ``class_cost`` is ``softmax`` (``-prob``, DETR) or ``focal`` (Deformable-DETR). Solved per image by
    ``scipy.optimize.linear_sum_assignment``. Raises ConfigError if all weights are 0 or ``class_cost``
    is unknown.
    """

    def __init__(
        self,
        *,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        class_cost: str = "softmax",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ConfigError(
                "loss.set_cost_class, set_cost_bbox and set_cost_giou are all 0; at least one must be non-zero."
            )
        if class_cost not in ("softmax", "focal"):
            raise ConfigError(f"Unknown class cost {class_cost!r}: valid are 'focal', 'softmax'.")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou
        self.class_cost = class_cost
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma

    def _class_cost(self, logits: Tensor, tgt_ids: Tensor) -> Tensor:
        if self.class_cost == "softmax":
            return -logits.softmax(-1)[:, tgt_ids]
        prob = logits.sigmoid()
        alpha, gamma = self.focal_alpha, self.focal_gamma
        neg = (1 - alpha) * (prob**gamma) * (-(1 - prob + 1e-8).log())
        pos = alpha * ((1 - prob) ** gamma) * (-(prob + 1e-8).log())
        return pos[:, tgt_ids] - neg[:, tgt_ids]

    @torch.no_grad()
    def forward(self, outputs: dict, targets: list[dict]) -> Indices:
        """Match ``pred_logits``/``pred_boxes`` ``[B, Q, 4]`` to each image's ``labels``/``boxes`` ``[N_i, 4]``.

        Boxes are normalised cxcywh. Returns per image ``(query_idx, target_idx)`` int64 CPU tensors of length
        ``min(Q, N_i)``, query indices ascending; non-finite costs are clamped rather than crashing the solver.
        """
        bs, num_queries = outputs["pred_logits"].shape[:2]
        sizes = [len(t["boxes"]) for t in targets]
        if sum(sizes) == 0:
            empty = torch.empty(0, dtype=torch.int64)
            return [(empty, empty) for _ in targets]
        logits = outputs["pred_logits"].flatten(0, 1)
        out_bbox = outputs["pred_boxes"].flatten(0, 1)
        tgt_ids = torch.cat([t["labels"] for t in targets])
        tgt_bbox = torch.cat([t["boxes"] for t in targets])

        cost = self.cost_bbox * torch.cdist(out_bbox, tgt_bbox, p=1)
        cost = cost + self.cost_class * self._class_cost(logits, tgt_ids)
        giou = generalized_box_iou(box_convert(out_bbox, "cxcywh", "xyxy"), box_convert(tgt_bbox, "cxcywh", "xyxy"))
        cost = cost - self.cost_giou * giou
        cost = cost.view(bs, num_queries, -1).cpu()
        if not torch.isfinite(cost).all():
            # A non-finite cost means non-finite predictions; the assignment is
            # then meaningless but must not crash the solver.
            cost = torch.nan_to_num(cost, nan=1e8, posinf=1e8, neginf=-1e8)

        # Imported here, not with the module: scipy.optimize is a large import that only training needs.
        from scipy.optimize import linear_sum_assignment

        indices = []
        for i, c in enumerate(cost.split(sizes, -1)):
            rows, cols = linear_sum_assignment(c[i].numpy())
            indices.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
        return indices
