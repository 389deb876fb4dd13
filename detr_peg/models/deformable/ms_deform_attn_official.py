"""The official ``ms_deform_attn_core_pytorch`` (Deformable-DETR ``models/ops/functions/ms_deform_attn_func.py``),
kept as the reference the tests and ``tools/bench_ms_deform_attn.py`` compare with; the model never uses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def ms_deform_attn_core_pytorch(
    value: Tensor,
    value_spatial_shapes: Tensor | Sequence[tuple[int, int]],
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Multi-scale deformable attention as the official pure-PyTorch code computes it.

    ``value`` ``[B, S, M, D]``; ``value_spatial_shapes`` ``(H_l, W_l)`` as ``[L, 2]`` int64 or a list;
    ``sampling_locations`` ``[B, Lq, M, L, P, 2]`` normalised ``(x, y)``, ``align_corners=False``,
    zeros outside; ``attention_weights`` ``[B, Lq, M, L, P]``. Returns contiguous ``[B, Lq, M * D]``.
    """
    b, _, m, d = value.shape
    _, lq, _, n_levels, n_points, _ = sampling_locations.shape
    shapes = value_spatial_shapes.tolist() if isinstance(value_spatial_shapes, Tensor) else value_spatial_shapes
    per_level = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * sampling_locations - 1
    samples = []
    for level, (h, w) in enumerate(shapes):
        value_l = per_level[level].flatten(2).transpose(1, 2).reshape(b * m, d, h, w)
        grid_l = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(value_l, grid_l, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = attention_weights.transpose(1, 2).reshape(b * m, 1, lq, n_levels * n_points)
    out = (torch.stack(samples, dim=-2).flatten(-2) * weights).sum(-1).view(b, m * d, lq)
    return out.transpose(1, 2).contiguous()
