"""The Deformable-DETR encoder (post-norm, no final norm): every token queries all levels around its own
pixel centre. The positional term is added to the queries only, and the positional encoding may
mix tokens between layers (where a PEG acts).
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from detr_peg.models.deformable.levels import LevelLayout, encoder_reference_points
from detr_peg.models.dropout import Dropout
from detr_peg.models.feedforward import get_activation
from detr_peg.models.position.base import PositionalEncoding


def with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    """``x + pos``, or ``x`` itself when there is no positional term."""
    return x if pos is None else x + pos


class DeformableEncoderLayer(nn.Module):
    """Multi-scale deformable self-attention and feed-forward block (post-norm)."""

    def __init__(
        self, *, self_attn: nn.Module, d_model: int, dim_feedforward: int, dropout: float, activation: str = "relu"
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.dropout1 = Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = get_activation(activation)
        self.dropout2 = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout3 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, src: Tensor, pos: Tensor | None, reference_points: Tensor, layout: LevelLayout) -> Tensor:
        """``src`` ``[B, S, C]``; ``pos`` ``[B, S, C]``, ``[S, C]`` or None; refs ``[B, S, L, 2]`` on padded maps."""
        attn = self.self_attn(
            with_pos(src, pos),
            reference_points,
            src,
            layout.spatial_shapes,
            layout.level_start_index,
            layout.mask,
            input_shapes=layout.shapes,
        )
        src = self.norm1(src + self.dropout1(attn))
        ffn = self.linear2(self.dropout2(self.activation(self.linear1(src))))
        return self.norm2(src + self.dropout3(ffn))


class DeformableEncoder(nn.Module):
    """A stack of ``num_layers`` clones of ``layer`` (``layers.{i}``)."""

    def __init__(self, *, layer: DeformableEncoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers

    def forward(self, src: Tensor, pos: Tensor | None, layout: LevelLayout, position: PositionalEncoding) -> Tensor:
        """``src`` ``[B, S, C]`` -> memory ``[B, S, C]``; ``position.mix`` runs where ``position.mixes_after(i)``."""
        reference_points = encoder_reference_points(layout)
        if position.mixes_after(-1):
            src = position.mix(-1, src, layout.mask, layout.shapes)
        for i, layer in enumerate(self.layers):
            src = layer(src, pos, reference_points, layout)
            if position.mixes_after(i):
                src = position.mix(i, src, layout.mask, layout.shapes)
        return src
