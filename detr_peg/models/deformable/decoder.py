"""The Deformable-DETR decoder, with optional iterative box refinement.

Each layer: self-attention among the queries (``query_pos`` added to queries
and keys), multi-scale deformable cross-attention from the queries to the
encoder memory around each query's reference point, and a feed-forward block;
post-norm, no final decoder norm.

Reference points are sigmoid-space and relative to the unpadded image: either
``(x, y)`` points (``Tensor[B, Q, 2]``) or ``(cx, cy, w, h)`` boxes
(``Tensor[B, Q, 4]``). Before each layer they are scaled by the valid ratios of
every level, because the attention samples on the padded maps.

With iterative box refinement the decoder is given one box head per layer:
after layer ``i`` the head predicts a delta in logit space, the reference
becomes ``sigmoid(delta + inverse_sigmoid(reference))`` (a point's delta only
moves its centre and adds a size, turning it into a box), and the result is
detached before it feeds the next layer, as in the official code.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from detr_peg.models.attention import MultiheadAttention
from detr_peg.models.deformable.levels import LevelLayout
from detr_peg.models.dropout import Dropout
from detr_peg.models.feedforward import get_activation


def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    """``log(x / (1 - x))`` with ``x`` clamped to ``[0, 1]`` and both terms to at least ``eps``."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def refine_reference(delta: Tensor, reference: Tensor) -> Tensor:
    """Apply a box head's logit-space delta to a reference, in logit space.

    Args:
        delta: ``Tensor[..., 4]`` box head output.
        reference: ``Tensor[..., 2]`` sigmoid-space points or ``Tensor[..., 4]`` boxes.

    Returns:
        ``Tensor[..., 4]`` unactivated (cx, cy, w, h); apply ``sigmoid`` for boxes.
        For a 2-d reference only the centre gets the reference added.
    """
    if reference.shape[-1] == 4:
        return delta + inverse_sigmoid(reference)
    if reference.shape[-1] != 2:
        raise ValueError(f"reference points must have 2 or 4 coordinates, got {reference.shape[-1]}")
    return torch.cat([delta[..., :2] + inverse_sigmoid(reference), delta[..., 2:]], -1)


class DeformableDecoderLayer(nn.Module):
    """Self-attention, deformable cross-attention and feed-forward block (post-norm).

    Norm names follow the official code: ``norm2`` after self-attention,
    ``norm1`` after cross-attention, ``norm3`` after the feed-forward block.

    Args:
        self_attn: multi-head self-attention among the queries.
        cross_attn: an ``MSDeformAttn`` over ``L`` levels.
        d_model: token width ``C``.
        dim_feedforward: feed-forward hidden width.
        dropout: dropout rate.
        activation: feed-forward activation name.
    """

    def __init__(
        self,
        *,
        self_attn: MultiheadAttention,
        cross_attn: nn.Module,
        d_model: int,
        dim_feedforward: int,
        dropout: float,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.cross_attn = cross_attn
        self.dropout1 = Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = self_attn
        self.dropout2 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = get_activation(activation)
        self.dropout3 = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout4 = Dropout(dropout)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self, tgt: Tensor, query_pos: Tensor, reference_points: Tensor, memory: Tensor, layout: LevelLayout
    ) -> Tensor:
        """Decode one layer.

        Args:
            tgt: ``Tensor[B, Q, C]`` query content.
            query_pos: ``Tensor[B, Q, C]`` query positional embedding.
            reference_points: ``Tensor[B, Q, L, 2 or 4]`` references scaled to
                each padded level.
            memory: ``Tensor[B, S, C]`` encoder output.
            layout: the memory's token layout (shapes, level starts, padding mask).

        Returns:
            ``Tensor[B, Q, C]``.
        """
        q = tgt + query_pos
        tgt = self.norm2(tgt + self.dropout2(self.self_attn(q, q, tgt)))
        attn = self.cross_attn(
            tgt + query_pos,
            reference_points,
            memory,
            layout.spatial_shapes,
            layout.level_start_index,
            layout.mask,
            input_shapes=layout.shapes,
        )
        tgt = self.norm1(tgt + self.dropout1(attn))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout4(ffn))


class DeformableDecoder(nn.Module):
    """A stack of deformable decoder layers returning every layer's output and references.

    Args:
        layer: the layer to clone ``num_layers`` times (``layers.{i}``).
        num_layers: number of layers.
    """

    def __init__(self, *, layer: DeformableDecoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers

    def forward(
        self,
        tgt: Tensor,
        reference_points: Tensor,
        memory: Tensor,
        layout: LevelLayout,
        query_pos: Tensor,
        box_heads: Sequence[nn.Module] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Decode the queries.

        Args:
            tgt: ``Tensor[B, Q, C]`` initial query content.
            reference_points: ``Tensor[B, Q, 2 or 4]`` initial sigmoid-space
                references, relative to the unpadded image.
            memory: ``Tensor[B, S, C]`` encoder output.
            layout: the memory's token layout.
            query_pos: ``Tensor[B, Q, C]`` query positional embedding.
            box_heads: one box head per layer for iterative refinement
                (``Tensor[..., C] -> Tensor[..., 4]``), or None to keep the
                references fixed.

        Returns:
            ``(hs, references)``: ``hs`` ``Tensor[N, B, Q, C]`` is the output
            of each of the ``N`` layers; ``references`` ``Tensor[N, B, Q, 2 or 4]``
            the (detached, with refinement) references after each layer.
        """
        ratios = layout.valid_ratios
        box_ratios = torch.cat([ratios, ratios], -1)
        output = tgt
        outputs, references = [], []
        for i, layer in enumerate(self.layers):
            scale = box_ratios if reference_points.shape[-1] == 4 else ratios
            output = layer(output, query_pos, reference_points[:, :, None] * scale[:, None], memory, layout)
            if box_heads is not None:
                reference_points = refine_reference(box_heads[i](output), reference_points).sigmoid().detach()
            outputs.append(output)
            references.append(reference_points)
        return torch.stack(outputs), torch.stack(references)
