"""The Deformable-DETR transformer, with a pluggable positional encoding.

Matches the official ``DeformableTransformer``: the levels' tokens are
flattened into one sequence, each token's positional term is its level's
``pos`` map plus a learned **level embedding**, a deformable encoder turns
them into the memory, and a deformable decoder refines the queries around
their reference points. Queries come from a learned ``query_embed``
(``Tensor[Q, 2C]``: the first ``C`` columns are the query positional
embedding, the last ``C`` the initial content; reference points are a linear
map of the former), or, in two-stage mode, from the top-scoring encoder
proposals (:mod:`~detr_peg.models.deformable.proposals`).

Positional encodings: ``sine`` and ``learned`` return a ``pos`` map per level,
exactly as in the official code. ``peg`` and ``none`` return none, and the
encoder lets the encoding mix the tokens between layers instead (PEG runs on
each level's own 2-D grid, mask-aware, see
:mod:`detr_peg.models.position.peg`).

**The level embedding stays with every encoding.** It is not a position: it
is one vector per feature level, the same for every token of that level, and
tells the deformable attention which scale a query comes from (the sampling
offsets and attention weights are predicted from the query, per level). PEG
cannot provide that, because each level has its own PEG applied to its own
grid. So with ``peg`` and ``none`` the positional term added to the encoder
queries is the level embedding alone, and the image tokens get their spatial
position from the PEG only.

The detector's heads are not registered here: the detector passes its box
heads (refinement) and its last class and box heads (two-stage proposals) to
:meth:`DeformableTransformer.forward`, so no module is stored twice.
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
    """What :class:`DeformableTransformer` returns.

    Attributes:
        hs: ``Tensor[N, B, Q, C]``, the output of each of the ``N`` decoder layers.
        init_reference: ``Tensor[B, Q, 2 or 4]`` sigmoid-space references the
            first decoder layer used (points, or two-stage proposal boxes).
        inter_references: ``Tensor[N, B, Q, 2 or 4]`` references after each
            layer (refined and detached with box refinement, else repeated).
        memory: ``Tensor[B, S, C]`` encoder output.
        layout: the token layout (shapes, level starts, mask, valid ratios).
        enc_outputs_class: two-stage: ``Tensor[B, S, K]`` proposal logits, else None.
        enc_outputs_coord_unact: two-stage: ``Tensor[B, S, 4]`` unactivated
            proposal boxes (``+inf`` at invalid proposals), else None.
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

    Args:
        encoder: the deformable encoder stack.
        decoder: the deformable decoder stack.
        position: the positional encoding (sine, learned, none, peg, ...).
        d_model: token width ``C``.
        num_feature_levels: feature levels ``L``.
        two_stage: queries from encoder proposals instead of ``query_embed``.
        two_stage_num_proposals: proposals kept as decoder queries (two-stage);
            capped at the number of tokens ``S``.
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
        """Encode the feature levels and decode the queries.

        Args:
            srcs: per level ``Tensor[B, C, H_l, W_l]`` projected features, finest first.
            masks: per level ``Tensor[B, H_l, W_l]`` bool, True = padding.
            query_embed: ``Tensor[Q, 2C]`` learned queries (not two-stage).
            box_heads: one box head per decoder layer for iterative refinement, or None.
            proposal_heads: two-stage: ``(class_head, box_head)`` scoring the
                encoder proposals.

        Returns:
            :class:`DeformableTransformerOutput`.
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
            query_pos, tgt = torch.split(query_embed, c, dim=1)
            query_pos = query_pos.unsqueeze(0).expand(b, -1, -1)
            tgt = tgt.unsqueeze(0).expand(b, -1, -1)
            reference_points = self.reference_points(query_pos).sigmoid()
        hs, inter_references = self.decoder(tgt, reference_points, memory, layout, query_pos, box_heads)
        return DeformableTransformerOutput(hs, reference_points, inter_references, memory, layout, enc_class, enc_coord)

    def _score_proposals(
        self, memory: Tensor, layout: LevelLayout, class_head: nn.Module, box_head: nn.Module
    ) -> tuple[Tensor, Tensor]:
        """Two-stage: class logits ``Tensor[B, S, K]`` and unactivated boxes ``Tensor[B, S, 4]`` per token."""
        proposals, valid = encoder_proposals(layout)
        keep = valid & ~layout.mask.unsqueeze(-1)
        output_memory = self.enc_output_norm(self.enc_output(memory.masked_fill(~keep, 0.0)))
        return class_head(output_memory), box_head(output_memory) + proposals
