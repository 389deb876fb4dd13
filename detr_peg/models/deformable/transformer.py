"""The Deformable-DETR transformer (the official ``DeformableTransformer``) with a pluggable positional
encoding. The learned level embedding stays with every encoding: it tells the deformable attention
which scale a query comes from, which per-level PEGs cannot; with ``peg``/``none`` it is the only
positional term. The detector passes its heads to :meth:`DeformableTransformer.forward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from detr_peg.models.deformable.decoder import DeformableDecoder
from detr_peg.models.deformable.encoder import DeformableEncoder
from detr_peg.models.deformable.levels import LevelLayout, flatten_levels, level_positions
from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.proposals import encoder_proposals, proposal_pos_embed
from detr_peg.models.position.base import PositionalEncoding


@dataclass
class DeformableTransformerOutput:
    """What :class:`DeformableTransformer` returns: ``hs`` ``[N, B, Q, C]`` per decoder layer; sigmoid-space
    ``init_reference`` ``[B, Q, 2 or 4]`` and ``inter_references`` ``[N, B, Q, 2 or 4]``; ``memory``
    ``[B, S, C]`` laid out as ``layout``; two-stage ``enc_outputs_class`` ``[B, S, K]`` and
    ``enc_outputs_coord_unact`` ``[B, S, 4]`` (``+inf`` at invalid proposals), else None.
    """

    hs: Tensor
    init_reference: Tensor
    inter_references: Tensor
    memory: Tensor
    layout: LevelLayout
    enc_outputs_class: Tensor | None = None
    enc_outputs_coord_unact: Tensor | None = None


class DeformableTransformer(nn.Module):
    """Deformable-DETR's multi-scale encoder-decoder.

    ``query_embed`` ``[Q, 2C]`` splits into query positional embedding then initial content; in two-stage
    mode the queries are the top ``two_stage_num_proposals`` (capped at ``S``) encoder proposals.
    """

    def __init__(
        self,
        *,
        encoder: DeformableEncoder,
        decoder: DeformableDecoder,
        position: PositionalEncoding,
        d_model: int,
        num_feature_levels: int,
        two_stage: bool = False,
        two_stage_num_proposals: int = 300,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.num_feature_levels = num_feature_levels
        self.two_stage = two_stage
        self.two_stage_num_proposals = two_stage_num_proposals
        self.encoder = encoder
        self.decoder = decoder
        self.level_embed = nn.Parameter(torch.empty(num_feature_levels, d_model))
        if two_stage:
            self.enc_output = nn.Linear(d_model, d_model)
            self.enc_output_norm = nn.LayerNorm(d_model)
            self.pos_trans = nn.Linear(d_model * 2, d_model * 2)
            self.pos_trans_norm = nn.LayerNorm(d_model * 2)
        else:
            self.reference_points = nn.Linear(d_model, 2)
        self._reset_parameters()
        self.position = position

    def _reset_parameters(self) -> None:
        # The official initialisation: Xavier on every matrix, then each
        # deformable attention's own initialisation, Xavier (gain 1) and a zero
        # bias for the reference-point map, and a normal level embedding. The
        # positional encoding is registered afterwards and keeps its own
        # initialisation (in the official code it lives in the backbone).
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for module in self.modules():
            if isinstance(module, MSDeformAttn):
                module._reset_parameters()
        if not self.two_stage:
            nn.init.xavier_uniform_(self.reference_points.weight, gain=1.0)
            nn.init.zeros_(self.reference_points.bias)
        nn.init.normal_(self.level_embed)

    def forward(
        self,
        srcs: list[Tensor],
        masks: list[Tensor],
        query_embed: Tensor | None = None,
        *,
        box_heads: Sequence[nn.Module] | None = None,
        proposal_heads: tuple[nn.Module, nn.Module] | None = None,
    ) -> DeformableTransformerOutput:
        """Encode ``srcs`` ``[B, C, H_l, W_l]`` (finest first; ``masks`` ``[B, H_l, W_l]``) and decode the queries.

        ``query_embed`` ``[Q, 2C]`` is required unless two-stage, ``proposal_heads`` ``(class_head, box_head)``
        when two-stage; otherwise, or for a wrong number of levels, ValueError.
        """
        if len(srcs) != self.num_feature_levels:
            raise ValueError(f"expected {self.num_feature_levels} feature levels, got {len(srcs)}")
        src, layout = flatten_levels(srcs, masks)
        pos = [None if p is None else p.to(src.dtype) for p in (self.position(m) for m in masks)]
        lvl_pos = level_positions(pos, self.level_embed, layout)
        memory = self.encoder(src, lvl_pos, layout, self.position)

        b, _, c = memory.shape
        enc_class = enc_coord = None
        if self.two_stage:
            if proposal_heads is None:
                raise ValueError("two-stage mode needs the proposal heads")
            enc_class, enc_coord = self._score_proposals(memory, layout, *proposal_heads)
            k = min(self.two_stage_num_proposals, enc_class.shape[1])
            topk = torch.topk(enc_class[..., 0], k, dim=1)[1]
            boxes_unact = torch.gather(enc_coord, 1, topk.unsqueeze(-1).expand(-1, -1, 4)).detach()
            reference_points = boxes_unact.sigmoid()
            embed = self.pos_trans_norm(self.pos_trans(proposal_pos_embed(boxes_unact, c // 2)))
            query_pos, tgt = torch.split(embed, c, dim=2)
        else:
            if query_embed is None:
                raise ValueError("query_embed is required unless two_stage is set")
            # A copy: views of a parameter made under no_grad trip torch's module hooks (FlopCounterMode).
            query_pos, tgt = torch.split(query_embed.unsqueeze(0).repeat(b, 1, 1), c, dim=2)
            reference_points = self.reference_points(query_pos).sigmoid()
        hs, inter_references = self.decoder(tgt, reference_points, memory, layout, query_pos, box_heads)
        return DeformableTransformerOutput(hs, reference_points, inter_references, memory, layout, enc_class, enc_coord)

    def _score_proposals(
        self, memory: Tensor, layout: LevelLayout, class_head: nn.Module, box_head: nn.Module
    ) -> tuple[Tensor, Tensor]:
        """Two-stage: class logits ``[B, S, K]`` and unactivated boxes ``[B, S, 4]`` per token."""
        proposals, valid = encoder_proposals(layout)
        keep = valid & ~layout.mask.unsqueeze(-1)
        output_memory = self.enc_output_norm(self.enc_output(memory.masked_fill(~keep, 0.0)))
        return class_head(output_memory), box_head(output_memory) + proposals
