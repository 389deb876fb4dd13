"""The Deformable-DETR encoder: multi-scale deformable self-attention over all levels.

Every token of every level is a query; its reference point is its own pixel
centre (:func:`~detr_peg.models.deformable.levels.encoder_reference_points`),
and it samples ``n_points`` values per head around that point on each level.
The layer is post-norm, as in the official code: attention, add, LayerNorm,
feed-forward, add, LayerNorm; there is no final encoder norm.

The positional term (``pos``: the sine/learned map plus the level embedding,
or the level embedding alone for ``peg`` and ``none``) is added to the queries
only; the values are the tokens themselves. Between layers the positional
encoding may mix the tokens (:meth:`PositionalEncoding.mix`), which is where a
PEG acts, exactly as in the DETR encoder.
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
    """Multi-scale deformable self-attention and feed-forward block (post-norm).

    Args:
        self_attn: an ``MSDeformAttn`` over ``L`` levels.
        d_model: token width ``C``.
        dim_feedforward: feed-forward hidden width.
        dropout: dropout rate.
        activation: feed-forward activation name.
    """

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
        """Encode one layer.

        Args:
            src: ``Tensor[B, S, C]`` tokens of all levels.
            pos: positional term, ``Tensor[B, S, C]`` or ``Tensor[S, C]``, or None.
            reference_points: ``Tensor[B, S, L, 2]`` normalised ``(x, y)`` over
                the padded maps.
            layout: the token layout (shapes, level starts, padding mask).

        Returns:
            ``Tensor[B, S, C]``.
        """
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
    """A stack of deformable encoder layers; the positional encoding may mix tokens between them.

    Args:
        layer: the layer to clone ``num_layers`` times (``layers.{i}``).
        num_layers: number of layers.
    """

    def __init__(self, *, layer: DeformableEncoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers

    def forward(self, src: Tensor, pos: Tensor | None, layout: LevelLayout, position: PositionalEncoding) -> Tensor:
        """Encode the multi-scale token sequence.

        Args:
            src: ``Tensor[B, S, C]`` flattened projected features.
            pos: positional term (see :class:`DeformableEncoderLayer`).
            layout: the token layout.
            position: the model's positional encoding; ``position.mix(i, ...)``
                runs after layer ``i`` (and ``i = -1`` before the first) when
                ``position.mixes_after(i)``.

        Returns:
            memory ``Tensor[B, S, C]``.
        """
        reference_points = encoder_reference_points(layout)
        if position.mixes_after(-1):
            src = position.mix(-1, src, layout.mask, layout.shapes)
        for i, layer in enumerate(self.layers):
            src = layer(src, pos, reference_points, layout)
            if position.mixes_after(i):
                src = position.mix(i, src, layout.mask, layout.shapes)
        return src
