"""Hungarian matching between predictions and ground-truth boxes."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou

from detr_peg.errors import ConfigError

Indices = list[tuple[Tensor, Tensor]]


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to targets minimising a weighted cost.

    The cost of matching query ``i`` to target ``j`` is
    ``cost_class * C_cls + cost_bbox * L1(box_i, box_j) - cost_giou * GIoU``.
    The class cost is ``-softmax prob`` (DETR, ``class_cost="softmax"``) or the
    focal-loss difference of Deformable-DETR (``class_cost="focal"``). The
    assignment is solved per image with
    ``scipy.optimize.linear_sum_assignment`` (query indices come out ascending).

    Args:
        cost_class: weight of the class cost.
        cost_bbox: weight of the L1 box cost.
        cost_giou: weight of the GIoU cost.
        class_cost: ``softmax`` or ``focal``.
        focal_alpha: focal class cost alpha.
        focal_gamma: focal class cost gamma.
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
        """Match.

        Args:
            outputs: ``pred_logits`` ``Tensor[B, Q, K]`` and ``pred_boxes``
                ``Tensor[B, Q, 4]`` (normalised cx, cy, w, h).
            targets: per image, ``labels`` ``Tensor[N_i]`` and ``boxes``
                ``Tensor[N_i, 4]`` (normalised cx, cy, w, h).

        Returns:
            Per image ``(query_idx, target_idx)``, int64 tensors of length
            ``min(Q, N_i)``.
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
