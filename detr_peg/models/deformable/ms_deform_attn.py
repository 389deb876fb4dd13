"""Deformable-DETR's ``MSDeformAttn`` module, with the official parameter names, layouts and init so
official state dicts load 1:1; the sampling is the pure-PyTorch :func:`ms_deform_attn`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.models.deformable.ms_deform_attn_function import (
    CUDA_IMPLEMENTATIONS,
    IMPLEMENTATIONS,
    LEVEL_SIZE_IMPLEMENTATIONS,
    ms_deform_attn,
)

__all__ = ["MSDeformAttn", "ms_deform_attn"]


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention (Zhu et al., "Deformable DETR", ICLR 2021).

    ``sampling_offsets`` outputs ``(heads, levels, points, (x, y))``; ``attention_weights`` outputs
    ``(heads, levels * points)``, softmaxed over ``n_levels * n_points``. ``impl``: see :func:`ms_deform_attn`.
    Raises ValueError if ``n_heads`` does not divide ``d_model``, a size is not positive, or ``impl`` is unknown.
    """

    def __init__(
        self, *, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4, impl: str = "embedding_bag"
    ) -> None:
        super().__init__()
        if min(d_model, n_levels, n_heads, n_points) <= 0:
            raise ValueError(
                f"MSDeformAttn sizes must be positive, got d_model={d_model}, n_levels={n_levels}, "
                f"n_heads={n_heads}, n_points={n_points}."
            )
        if d_model % n_heads != 0:
            raise ValueError(f"MSDeformAttn d_model must be divisible by n_heads, got {d_model} and {n_heads}.")
        if impl not in IMPLEMENTATIONS + CUDA_IMPLEMENTATIONS:
            raise ValueError(
                f"Unknown ms_deform_attn impl {impl!r}: valid are {', '.join(IMPLEMENTATIONS + CUDA_IMPLEMENTATIONS)}."
            )
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.impl = impl

        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Official init: zero offset weights, a ring of points per head as bias, uniform attention, Xavier."""
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        thetas = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True)[0]
        scale = torch.arange(1, self.n_points + 1, dtype=torch.float32).view(1, 1, self.n_points, 1)
        grid = grid.view(self.n_heads, 1, 1, 2).repeat(1, self.n_levels, self.n_points, 1) * scale
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.constant_(self.value_proj.bias, 0.0)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.constant_(self.output_proj.bias, 0.0)

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        input_flatten: Tensor,
        input_spatial_shapes: Tensor,
        input_level_start_index: Tensor,
        input_padding_mask: Tensor | None = None,
        *,
        input_shapes: Sequence[tuple[int, int]] | None = None,
    ) -> Tensor:
        """Attend from every query ``[B, Lq, C]`` (positional embedding added) to sampled points of the levels.

        ``reference_points``: ``[B, Lq, L, 2]`` normalised ``(x, y)`` over the padded map, or ``[B, Lq, L, 4]``
        normalised cxcywh boxes; ``input_flatten`` ``[B, S, C]``; shapes and level starts as in
        :func:`ms_deform_attn`; ``input_padding_mask`` ``[B, S]`` bool, True = padding (zeroed values);
        ``input_shapes`` the sizes as (possibly symbolic) ints, which keep an exported graph's image size
        dynamic. Returns ``[B, Lq, C]``; raises ValueError for bad reference widths or level sizes.
        """
        b, len_q, _ = query.shape
        _, len_in, _ = input_flatten.shape
        _check_inputs(reference_points, len_in, input_spatial_shapes, input_shapes)

        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(b, len_in, self.n_heads, self.d_model // self.n_heads)
        offsets = self.sampling_offsets(query)  # [B, Lq, M * L * P * 2], laid out (M, L, P, (x, y))
        weights = self.attention_weights(query).view(b, len_q, self.n_heads, self.n_levels * self.n_points)
        weights = F.softmax(weights, -1).view(b, len_q, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            locations = self._point_locations(reference_points, offsets, input_spatial_shapes)
        else:
            offsets = offsets.view(b, len_q, self.n_heads, self.n_levels, self.n_points, 2)
            locations = (
                reference_points[:, :, None, :, None, :2]
                + offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5
            )
        per_level = input_shapes is not None and self.impl in LEVEL_SIZE_IMPLEMENTATIONS
        shapes = input_shapes if per_level else input_spatial_shapes
        output = ms_deform_attn(value, shapes, input_level_start_index, locations, weights, impl=self.impl)
        return self.output_proj(output)

    def _point_locations(self, reference_points: Tensor, offsets: Tensor, spatial_shapes: Tensor) -> Tensor:
        """``ref + offset / (W_l, H_l)`` as ``[B, Lq, M, L, P, 2]``, over contiguous columns (bit-identical)."""
        b, len_q, n_levels, _ = reference_points.shape
        m, p = self.n_heads, self.n_points
        # (W_l, H_l) of every column (m, l, p, xy): [M * L * P * 2].
        normalizer = spatial_shapes.flip(-1)[None, :, None, :].expand(m, n_levels, p, 2).reshape(-1)
        # The reference point of every column, expanded in two steps (over points, then over heads)
        # so that each copy has inner rows of L * P * 2 values rather than 2.
        per_point = reference_points[:, :, :, None, :].expand(b, len_q, n_levels, p, 2).reshape(b, len_q, 1, -1)
        references = per_point.expand(b, len_q, m, n_levels * p * 2).reshape(b, len_q, -1)
        return (references + offsets / normalizer).view(b, len_q, m, n_levels, p, 2)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_levels={self.n_levels}, n_heads={self.n_heads}, "
            f"n_points={self.n_points}, impl={self.impl!r}"
        )


def _check_inputs(
    reference_points: Tensor,
    len_in: int,
    input_spatial_shapes: Tensor,
    input_shapes: Sequence[tuple[int, int]] | None,
) -> None:
    """ValueError for references not ending in 2 or 4, or (CPU, eager) sizes not fitting ``len_in``/``input_shapes``."""
    if reference_points.shape[-1] not in (2, 4):
        raise ValueError(
            "MSDeformAttn reference_points must end in 2 (x, y) or 4 (cx, cy, w, h), "
            f"got shape {tuple(reference_points.shape)}."
        )
    # Checking a GPU tensor would sync with the host; under torch.export the sizes are symbolic, and under
    # torch.compile reading them breaks the graph in every attention layer: the check runs in eager mode only.
    if input_spatial_shapes.device.type == "cpu" and not torch.compiler.is_compiling():
        sizes = input_spatial_shapes.tolist()
        total = sum(h * w for h, w in sizes)
        if total != len_in:
            raise ValueError(
                f"MSDeformAttn input_flatten has {len_in} tokens but input_spatial_shapes {sizes} add up to {total}."
            )
        if input_shapes is not None:
            given = [[int(h), int(w)] for h, w in input_shapes]
            if given != sizes:
                raise ValueError(f"MSDeformAttn input_shapes {given} differ from input_spatial_shapes {sizes}.")
