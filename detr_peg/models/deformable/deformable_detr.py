"""The Deformable-DETR detector (fundamentalvision/Deformable-DETR). Without box refinement
``class_embed``/``bbox_embed`` list one shared module per layer, as the official code does, so the
state dict holds the official alias keys.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from detr_peg.models.backbones.base import Backbone
from detr_peg.models.deformable.decoder import refine_reference
from detr_peg.models.deformable.transformer import DeformableTransformer
from detr_peg.models.feedforward import MLP
from detr_peg.models.masking import batch_with_mask, level_masks

GROUP_NORM_GROUPS = 32
PRIOR_PROB = 0.01


class InputProjection(nn.Module):
    """Conv + GroupNorm(32) to ``hidden_dim`` channels; keys ``conv.*``/``norm.*`` are the official ``0.*``/``1.*``."""

    def __init__(self, *, in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(GROUP_NORM_GROUPS, out_channels)
        nn.init.xavier_uniform_(self.conv.weight, gain=1)
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``Tensor[B, C_in, H, W]`` -> ``Tensor[B, C, H', W']``."""
        return self.norm(self.conv(x))


class DeformableDETR(nn.Module):
    """Deformable-DETR: multi-scale backbone, deformable transformer, sigmoid (focal) class head, box head.

    ``num_classes`` has no "no object" class; ``num_queries`` is ignored with ``two_stage`` (which needs
    ``with_box_refine``). ``feature_strides``: every level's stride (extra levels double the last).
    Raises ValueError for inconsistent ``two_stage`` or more backbone levels than the transformer takes.
    """

    def __init__(
        self,
        *,
        backbone: Backbone,
        transformer: DeformableTransformer,
        num_classes: int,
        num_queries: int,
        aux_loss: bool = True,
        with_box_refine: bool = False,
        two_stage: bool = False,
        mask_rule: str = "nearest",
    ) -> None:
        super().__init__()
        if two_stage and not with_box_refine:
            raise ValueError("two_stage needs with_box_refine (as in the official Deformable-DETR)")
        if two_stage != transformer.two_stage:
            raise ValueError("two_stage must match the transformer's two_stage")
        d = transformer.d_model
        num_levels = transformer.num_feature_levels
        in_channels = list(backbone.out_channels)
        if len(in_channels) > num_levels:
            raise ValueError(f"the backbone returns {len(in_channels)} levels but the transformer takes {num_levels}")
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.num_feature_levels = num_levels
        self.aux_loss = aux_loss
        self.with_box_refine = with_box_refine
        self.two_stage = two_stage
        self.mask_rule = mask_rule
        strides = list(backbone.strides)
        while len(strides) < num_levels:
            strides.append(strides[-1] * 2)  # each extra level is a stride-2 convolution of the previous one
        self.feature_strides = strides
        self.backbone = backbone
        self.transformer = transformer
        projections = [InputProjection(in_channels=c, out_channels=d) for c in in_channels]
        extra_in = in_channels[-1]
        for _ in range(num_levels - len(in_channels)):
            projections.append(InputProjection(in_channels=extra_in, out_channels=d, kernel_size=3, stride=2))
            extra_in = d
        self.input_proj = nn.ModuleList(projections)
        # In the layout of the backbone's maps (channels_last: no re-ordered weight copy in every call).
        self.input_proj.to(memory_format=backbone.memory_format)
        if not two_stage:
            self.query_embed = nn.Embedding(num_queries, 2 * d)
        self.class_embed, self.bbox_embed = self._build_heads(d, num_classes, transformer.decoder.num_layers)

    @property
    def size_divisibility(self) -> int:
        """The multiple a padded batch's sides should be (the coarsest stride), so both mask rules agree."""
        return max(self.feature_strides)

    def _build_heads(self, d: int, num_classes: int, num_layers: int) -> tuple[nn.ModuleList, nn.ModuleList]:
        class_head = nn.Linear(d, num_classes)
        box_head = MLP(d, d, 4, 3)
        nn.init.constant_(class_head.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        nn.init.zeros_(box_head.layers[-1].weight)
        nn.init.zeros_(box_head.layers[-1].bias)
        num_pred = num_layers + 1 if self.two_stage else num_layers
        if not self.with_box_refine:
            # One head pair shared by every layer; small initial sizes (sigmoid(-2)).
            nn.init.constant_(box_head.layers[-1].bias[2:], -2.0)
            return nn.ModuleList([class_head] * num_pred), nn.ModuleList([box_head] * num_pred)
        class_heads = nn.ModuleList(copy.deepcopy(class_head) for _ in range(num_pred))
        box_heads = nn.ModuleList(copy.deepcopy(box_head) for _ in range(num_pred))
        # As in the official code, only the first layer's box head starts with small sizes,
        # and two-stage proposals already carry a size, so there no head does.
        bias_value = 0.0 if self.two_stage else -2.0
        with torch.no_grad():
            box_heads[0].layers[-1].bias[2:] = bias_value
        return class_heads, box_heads

    def forward(self, images: Tensor | Sequence[Tensor], mask: Tensor | None = None) -> dict:
        """Detect objects; inputs as :meth:`DETR.forward <detr_peg.models.detr.detr.DETR.forward>`.

        Returns ``pred_logits`` ``[B, Q, K]`` sigmoid logits, ``pred_boxes`` ``[B, Q, 4]`` cxcywh normalised
        to each unpadded image, ``aux_outputs`` (with ``aux_loss``) for layers ``0 .. N-2``, and two-stage
        ``enc_outputs`` ``[B, S, K]``/``[B, S, 4]`` per encoder token (invalid proposals: boxes exactly 1.0).
        """
        images, mask = batch_with_mask(images, mask, self.size_divisibility)
        features = self.backbone(images)
        srcs = [proj(f) for proj, f in zip(self.input_proj, features)]
        for level in range(len(features), self.num_feature_levels):
            srcs.append(self.input_proj[level](features[-1] if level == len(features) else srcs[-1]))
        masks = level_masks(mask, [s.shape[-2:] for s in srcs], self.feature_strides, self.mask_rule)

        out_t = self.transformer(
            srcs,
            masks,
            None if self.two_stage else self.query_embed.weight,
            box_heads=self.bbox_embed if self.with_box_refine else None,
            proposal_heads=(self.class_embed[-1], self.bbox_embed[-1]) if self.two_stage else None,
        )
        logits, boxes = [], []
        for lvl, hs in enumerate(out_t.hs):
            reference = out_t.init_reference if lvl == 0 else out_t.inter_references[lvl - 1]
            logits.append(self.class_embed[lvl](hs))
            boxes.append(refine_reference(self.bbox_embed[lvl](hs), reference).sigmoid())
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        if self.two_stage:
            out["enc_outputs"] = {
                "pred_logits": out_t.enc_outputs_class,
                "pred_boxes": out_t.enc_outputs_coord_unact.sigmoid(),
            }
        return out
