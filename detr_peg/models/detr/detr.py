"""The DETR detector."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from detr_peg.models.backbones.base import Backbone
from detr_peg.models.detr.transformer import Transformer
from detr_peg.models.feedforward import MLP
from detr_peg.models.masking import batch_with_mask, level_masks


class DETR(nn.Module):
    """DETR: backbone, 1x1 projection, transformer, class and box heads.

    Args:
        backbone: feature extractor; its last level is used.
        transformer: the encoder-decoder (holds the positional encoding).
        num_classes: object classes; the class head has ``num_classes + 1``
            outputs, the last one being "no object".
        num_queries: object queries (the most objects one image can yield).
        aux_loss: also return the predictions of every earlier decoder layer.
        mask_rule: ``nearest`` (official) or ``stride``; see :mod:`detr_peg.models.masking`.

    Attributes:
        feature_strides: the stride of the one feature level the transformer sees.
        size_divisibility: padded batches should be a multiple of this many
            pixels (the coarsest stride), so both mask rules give each level
            the valid extent the image alone has.
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
        """Pixels a padded batch's height and width should be a multiple of."""
        return max(self.feature_strides)

    def forward(self, images: Tensor | Sequence[Tensor], mask: Tensor | None = None) -> dict:
        """Detect objects.

        Args:
            images: ``Tensor[B, 3, H, W]`` padded batch (normalised, zeros in the
                padding) or a list of unpadded ``Tensor[3, H_i, W_i]`` (padded
                here to a multiple of :attr:`size_divisibility`).
            mask: ``Tensor[B, H, W]`` bool, True = padding (batch input only;
                ``None`` = no padding).

        Returns:
            dict with

            - ``pred_logits``: ``Tensor[B, Q, num_classes + 1]``, softmax logits,
              last index = no object.
            - ``pred_boxes``: ``Tensor[B, Q, 4]``, normalised (cx, cy, w, h) in
              [0, 1] relative to each unpadded image.
            - ``aux_outputs`` (if ``aux_loss``): list of ``{"pred_logits",
              "pred_boxes"}`` for decoder layers ``0 .. L-2``.
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
