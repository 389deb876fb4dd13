"""The DETR detector."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from detr_peg.models.backbones.base import Backbone
from detr_peg.models.detr.transformer import Transformer
from detr_peg.models.feedforward import MLP
from detr_peg.models.masking import batch_with_mask, level_masks


class DETR(nn.Module):
    """DETR: backbone (last level), 1x1 projection, transformer, class and box heads.

    The class head has ``num_classes + 1`` outputs, the last being "no object".
    """

    def __init__(
        self,
        *,
        backbone: Backbone,
        transformer: Transformer,
        num_classes: int,
        num_queries: int,
        aux_loss: bool = True,
        mask_rule: str = "nearest",
    ) -> None:
        super().__init__()
        self.mask_rule = mask_rule
        self.feature_strides = [backbone.strides[-1]]
        d = transformer.d_model
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.aux_loss = aux_loss
        self.backbone = backbone
        self.input_proj = nn.Conv2d(backbone.out_channels[-1], d, kernel_size=1)
        self.transformer = transformer
        self.query_embed = nn.Embedding(num_queries, d)
        self.class_embed = nn.Linear(d, num_classes + 1)
        self.bbox_embed = MLP(d, d, 4, 3)

    @property
    def size_divisibility(self) -> int:
        """Pixels a padded batch's height and width should be a multiple of (the stride), so both mask rules agree."""
        return max(self.feature_strides)

    def forward(self, images: Tensor | Sequence[Tensor], mask: Tensor | None = None) -> dict:
        """Detect objects in ``images``: ``[B, 3, H, W]`` normalised, zeros in the padding, with ``mask`` ``[B, H, W]``
        bool (True = padding, None = none), or a list of unpadded ``[3, H_i, W_i]``.

        Returns ``pred_logits`` ``[B, Q, num_classes + 1]`` (last = no object), ``pred_boxes`` ``[B, Q, 4]``
        cxcywh normalised to each unpadded image, and with ``aux_loss`` ``aux_outputs`` for layers ``0 .. L-2``.
        """
        images, mask = batch_with_mask(images, mask, self.size_divisibility)
        feature = self.backbone(images)[-1]
        (feature_mask,) = level_masks(mask, [feature.shape[-2:]], self.feature_strides, self.mask_rule)
        hs, _ = self.transformer(self.input_proj(feature), feature_mask, self.query_embed.weight)
        logits = self.class_embed(hs)
        boxes = self.bbox_embed(hs).sigmoid()
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        return out
