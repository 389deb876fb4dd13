"""The Deformable-DETR decoder (post-norm, no final norm), with optional iterative box refinement.
References are sigmoid-space, relative to the unpadded image, and scaled by each level's valid
ratios before every layer because the attention samples the padded maps.
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
    """Apply a box head's logit-space ``delta`` ``[..., 4]`` to a sigmoid-space reference ``[..., 2 or 4]``.

    Returns unactivated ``(cx, cy, w, h)`` ``[..., 4]``; a 2-d reference is added to the centre only.
    Raises ValueError for another reference width.
    """
    if reference.shape[-1] == 4:
        return delta + inverse_sigmoid(reference)
    if reference.shape[-1] != 2:
        raise ValueError(f"reference points must have 2 or 4 coordinates, got {reference.shape[-1]}")
    return torch.cat([delta[..., :2] + inverse_sigmoid(reference), delta[..., 2:]], -1)


class DeformableDecoderLayer(nn.Module):
    """Self-attention, deformable cross-attention and feed-forward block (post-norm).

    Norm names are the official ones: ``norm2`` after self-attention, ``norm1`` after cross-attention,
    ``norm3`` after the feed-forward block.
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
        """``tgt``, ``query_pos`` ``[B, Q, C]``; refs ``[B, Q, L, 2 or 4]`` per padded level; memory ``[B, S, C]``."""
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
    """A stack of ``num_layers`` clones of ``layer`` (``layers.{i}``)."""

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
        """Decode ``tgt``/``query_pos`` ``[B, Q, C]`` over ``memory`` ``[B, S, C]`` around ``reference_points``
        ``[B, Q, 2 or 4]`` (sigmoid-space, relative to the unpadded image).

        With ``box_heads`` (one per layer) references are refined and detached after each layer, as
        officially. Returns ``(hs [N, B, Q, C], references [N, B, Q, 2 or 4])``.
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
