"""Multi-scale deformable attention with one ``grid_sample`` per level: ``impl="grid_sample"`` (reference
semantics, FLOP counting, ``torch.compile(fullgraph=True)``) and ``"grid_sample_sum"`` (the ONNX export
path: ``GridSample``, ``Mul``, ``ReduceSum``; docs/export.md). Level sizes given as a list stay
symbolic under ``torch.export``; a tensor is read on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.nn.functional as F
from torch import Tensor

__all__ = ["level_sizes", "ms_deform_attn_grid_sample", "ms_deform_attn_grid_sample_sum"]


def level_sizes(spatial_shapes: Tensor | Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``(H_l, W_l)`` of every level as integers (a tensor is read on the host)."""
    if isinstance(spatial_shapes, Tensor):
        return [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    return [(h, w) for h, w in spatial_shapes]


def _value_maps(value: Tensor, shapes: list[tuple[int, int]]) -> list[Tensor]:
    """``[B, S, M, D]`` -> per level ``[B * M, D, H_l, W_l]`` (``split``, whose backward is one cat)."""
    b, s, m, d = value.shape
    maps = value.permute(0, 2, 3, 1).reshape(b * m, d, s).split([h * w for h, w in shapes], dim=2)
    return [level.view(b * m, d, h, w) for level, (h, w) in zip(maps, shapes)]


def _sum_over_levels(
    value: Tensor,
    spatial_shapes: Tensor | Sequence[Sequence[int]],
    grids: Tensor,
    weigh: Callable[[Tensor, int], Tensor],
) -> Tensor:
    """Bilinear ``grid_sample`` of each level at ``grids[level]``, weighted by ``weigh(samples, level)``, summed."""
    output = None
    for level, value_l in enumerate(_value_maps(value, level_sizes(spatial_shapes))):
        sampled = F.grid_sample(value_l, grids[level], mode="bilinear", padding_mode="zeros", align_corners=False)
        term = weigh(sampled, level)
        output = term if output is None else output + term
    return output


def ms_deform_attn_grid_sample(
    value: Tensor,
    spatial_shapes: Tensor | Sequence[Sequence[int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """One ``grid_sample`` per level, weighted by a batched matrix product.

    ``value`` ``[B, S, M, D]``; ``spatial_shapes`` list of ``(H_l, W_l)`` or ``[L, 2]``;
    ``sampling_locations`` ``[B, Lq, M, L, P, 2]`` normalised ``(x, y)``; ``attention_weights``
    ``[B, Lq, M, L, P]``. Returns ``[B, Lq, M * D]``.
    """
    b, s, m, d = value.shape
    _, lq, _, n_levels, n_points, _ = sampling_locations.shape
    # [L, B * M, Lq, P, 2] and [L, B * M, Lq, P, 1], grouped by level for the loop.
    grids = (2 * sampling_locations - 1).permute(3, 0, 2, 1, 4, 5).reshape(n_levels, b * m, lq, n_points, 2)
    weights = attention_weights.permute(3, 0, 2, 1, 4).reshape(n_levels, b * m, lq, n_points, 1)
    # [B * M, D, Lq, P] -> [B * M, Lq, D, P] @ [B * M, Lq, P, 1] -> [B * M, Lq, D, 1]
    output = _sum_over_levels(
        value, spatial_shapes, grids, lambda sampled, level: sampled.permute(0, 2, 1, 3) @ weights[level]
    )
    return output.view(b, m, lq, d).transpose(1, 2).reshape(b, lq, m * d)


def ms_deform_attn_grid_sample_sum(
    value: Tensor,
    spatial_shapes: Tensor | Sequence[Sequence[int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """As :func:`ms_deform_attn_grid_sample`, the grid ``P`` rows of ``Lq`` points, weighted elementwise and summed."""
    b, s, m, d = value.shape
    _, lq, _, n_levels, n_points, _ = sampling_locations.shape
    # [L, B * M, P, Lq, 2] grids and [L, B * M, 1, P, Lq] weights, grouped by level for the loop.
    grids = (2 * sampling_locations - 1).permute(3, 0, 2, 4, 1, 5).reshape(n_levels, b * m, n_points, lq, 2)
    weights = attention_weights.permute(3, 0, 2, 4, 1).reshape(n_levels, b * m, 1, n_points, lq)
    # [B * M, D, P, Lq] weighted and summed over the points: [B * M, D, Lq]
    output = _sum_over_levels(value, spatial_shapes, grids, lambda sampled, level: (sampled * weights[level]).sum(2))
    return output.view(b, m * d, lq).transpose(1, 2)
