"""The set-prediction loss of DETR and Deformable-DETR."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou_loss, sigmoid_focal_loss

from detr_peg.errors import ConfigError
from detr_peg.models.argument_checks import check_targets
from detr_peg.models.matcher import HungarianMatcher, Indices


def average_num_boxes(targets: list[dict], device: torch.device) -> Tensor:
    """Target boxes per process, averaged over all processes and at least 1, as a 0-dim float32 tensor.

    Every process then normalises by the same number, so the DDP gradient average equals the gradient
    of the loss over the global batch.
    """
    num = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(num)
        num = num / dist.get_world_size()
    return num.clamp(min=1)


def _src_permutation_idx(indices: Indices) -> tuple[Tensor, Tensor]:
    batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    src_idx = torch.cat([src for src, _ in indices])
    return batch_idx, src_idx


class SetCriterion(nn.Module):
    """Hungarian-matched classification, L1 and GIoU losses, with auxiliary terms.

    Returns unweighted terms as the official ``SetCriterion``: ``loss_ce``, ``loss_bbox``, ``loss_giou``,
    and for logging ``class_error`` and ``cardinality_error``; aux layer ``i`` terms get suffix ``_i``,
    two-stage proposals (matched class-agnostically) ``_enc``. ``class_loss`` is ``ce`` (softmax with a
    "no object" class weighted by ``eos_coef``; DETR) or ``focal`` (Deformable-DETR); anything else
    raises ConfigError.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        matcher: HungarianMatcher,
        weight_dict: dict[str, float],
        class_loss: str = "ce",
        eos_coef: float = 0.1,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ) -> None:
        super().__init__()
        if class_loss not in ("ce", "focal"):
            raise ConfigError(f"Unknown class loss {class_loss!r}: valid are 'ce', 'focal'.")
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = dict(weight_dict)
        self.class_loss = class_loss
        self.eos_coef = eos_coef
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight, persistent=False)

    # ----------------------------------------------------------------- terms

    def loss_labels(
        self, outputs: dict, targets: list[dict], indices: Indices, num_boxes: Tensor, log: bool = True
    ) -> dict[str, Tensor]:
        logits = outputs["pred_logits"]
        idx = _src_permutation_idx(indices)
        matched_labels = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[idx] = matched_labels
        if self.class_loss == "ce":
            loss = F.cross_entropy(logits.transpose(1, 2), target_classes, self.empty_weight.to(logits.dtype))
        else:
            onehot = torch.zeros((*logits.shape[:2], logits.shape[2] + 1), dtype=logits.dtype, device=logits.device)
            onehot.scatter_(2, target_classes.unsqueeze(-1), 1)
            focal = sigmoid_focal_loss(
                logits, onehot[..., :-1], alpha=self.focal_alpha, gamma=self.focal_gamma, reduction="none"
            )
            # The official normalisation: mean over queries, sum, / num_boxes, x queries.
            loss = focal.mean(1).sum() / num_boxes * logits.shape[1]
        losses = {"loss_ce": loss}
        if log:
            losses["class_error"] = 100 - _top1_accuracy(logits[idx], matched_labels)
        return losses

    @torch.no_grad()
    def loss_cardinality(
        self, outputs: dict, targets: list[dict], indices: Indices, num_boxes: Tensor
    ) -> dict[str, Tensor]:
        """Logging only: |predicted non-"no object" count - target count|, as officially (meaningless if focal)."""
        logits = outputs["pred_logits"]
        lengths = torch.as_tensor([len(t["labels"]) for t in targets], device=logits.device)
        card_pred = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1)
        return {"cardinality_error": F.l1_loss(card_pred.float(), lengths.float())}

    def loss_boxes(self, outputs: dict, targets: list[dict], indices: Indices, num_boxes: Tensor) -> dict[str, Tensor]:
        idx = _src_permutation_idx(indices)
        src = outputs["pred_boxes"][idx]
        tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)], dim=0)
        loss_bbox = F.l1_loss(src, tgt, reduction="none").sum() / num_boxes
        loss_giou = (
            generalized_box_iou_loss(
                box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"), reduction="sum"
            )
            / num_boxes
        )
        return {"loss_bbox": loss_bbox, "loss_giou": loss_giou}

    # ------------------------------------------------------------------ main

    def _stage(
        self, outputs: dict, targets: list[dict], num_boxes: Tensor, suffix: str, log: bool
    ) -> tuple[dict[str, Tensor], Indices]:
        indices = self.matcher(outputs, targets)
        device = outputs["pred_logits"].device
        on_device = [(i.to(device), j.to(device)) for i, j in indices]
        losses = {}
        losses.update(self.loss_labels(outputs, targets, on_device, num_boxes, log=log))
        losses.update(self.loss_boxes(outputs, targets, on_device, num_boxes))
        losses.update(self.loss_cardinality(outputs, targets, on_device, num_boxes))
        return {k + suffix: v for k, v in losses.items()}, indices

    def forward(self, outputs: dict, targets: list[dict], return_indices: bool = False):
        """Compute all loss terms.

        ``targets``: per image ``labels`` ``[N_i]`` int64 and ``boxes`` ``[N_i, 4]`` normalised cxcywh, on the
        outputs' device. Returns ``dict[str, Tensor]`` of 0-dim terms; with ``return_indices``,
        ``(losses, {"final": ..., "aux0": ..., "enc": ...})``.
        """
        check_targets(outputs, targets, self.num_classes)
        num_boxes = average_num_boxes(targets, outputs["pred_logits"].device)
        losses, final = self._stage(outputs, targets, num_boxes, "", log=True)
        all_indices = {"final": final}
        for i, aux in enumerate(outputs.get("aux_outputs", [])):
            terms, all_indices[f"aux{i}"] = self._stage(aux, targets, num_boxes, f"_{i}", log=False)
            losses.update(terms)
        if "enc_outputs" in outputs:
            binary = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
            terms, all_indices["enc"] = self._stage(outputs["enc_outputs"], binary, num_boxes, "_enc", log=False)
            losses.update(terms)
        return (losses, all_indices) if return_indices else losses

    def weighted_total(self, losses: dict[str, Tensor]) -> Tensor:
        """``sum(losses[k] * weight_dict[k])`` over the weighted terms present."""
        return sum(losses[k] * w for k, w in self.weight_dict.items() if k in losses)


def _top1_accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Top-1 accuracy in percent (0 when there is nothing to classify)."""
    if labels.numel() == 0:
        return torch.zeros((), device=logits.device)
    return (logits.argmax(-1) == labels).float().mean() * 100


def build_weight_dict(*, ce: float, bbox: float, giou: float, num_aux: int, two_stage: bool) -> dict[str, float]:
    """The official weight dict: base terms, one copy per auxiliary layer, ``_enc`` for two-stage."""
    if ce == 0 and bbox == 0 and giou == 0:  # the loss would be 0 whatever the model does: nothing would train
        raise ConfigError("loss.ce_loss_coef, bbox_loss_coef and giou_loss_coef are all 0; at least one must be "
                          "non-zero.")  # fmt: skip
    base = {"loss_ce": ce, "loss_bbox": bbox, "loss_giou": giou}
    weights = dict(base)
    for i in range(num_aux):
        weights.update({f"{k}_{i}": v for k, v in base.items()})
    if two_stage:
        weights.update({f"{k}_enc": v for k, v in base.items()})
    return weights
