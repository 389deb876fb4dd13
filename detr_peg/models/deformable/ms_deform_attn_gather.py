"""Multi-scale deformable attention as gather-multiply-sum (``impl="gather"``): plain, shape-polymorphic
tensor ops for exported graphs that must do without ``GridSample``. Equal to the default path to
float rounding, but materialises one corner's samples at a time, so training keeps ``embedding_bag``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ms_deform_attn_gather"]

# Pixel coordinates are clamped to [-2, _COORD_LIMIT] before the float -> int cast (as in
# the default path): beyond that range a corner is outside every level anyway.
_COORD_LIMIT = float(2**24)


def ms_deform_attn_gather(
    value: Tensor,
    spatial_shapes: Tensor,
    level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Deformable attention with gathers and batched matrix products.

    ``value`` ``[B, S, M, D]``; ``spatial_shapes`` ``[L, 2]`` int64 ``(H_l, W_l)``; ``level_start_index``
    ``[L]`` int64; ``sampling_locations`` ``[B, Lq, M, L, P, 2]`` normalised ``(x, y)``,
    ``align_corners=False``; ``attention_weights`` ``[B, Lq, M, L, P]``; all floats in one dtype.
    Returns ``[B, Lq, M * D]``.
    """
    b, s, m, d = value.shape
    lq, n_levels, n_points = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
    dtype = torch.float64 if sampling_locations.dtype == torch.float64 else torch.float32
    spatial_shapes = spatial_shapes.to(value.device)
    size = spatial_shapes.flip(-1).view(n_levels, 1, 2)  # (W, H) per level, broadcast over points
    # Pixel coordinate ((2 * loc - 1) + 1) * (W / 2) - 0.5, as grid_sample computes it.
    xy = torch.addcmul(
        torch.full((), -0.5, dtype=dtype, device=value.device),
        sampling_locations.to(dtype) * 2 - 1 + 1,
        size.to(dtype) / 2,
    )
    xy = xy.clamp(-2.0, _COORD_LIMIT)
    corner0 = xy.floor()
    frac = xy - corner0
    corner0 = corner0.to(torch.int64)  # [B, Lq, M, L, P, 2]
    # Row of value.reshape(B * S * M, D): ((b * S + start_l + y * W_l + x) * M + m).
    base = (torch.arange(b, device=value.device) * s).view(b, 1, 1, 1, 1) + level_start_index.to(value.device).view(
        1, 1, 1, n_levels, 1
    )
    head = torch.arange(m, device=value.device).view(1, 1, m, 1, 1)
    table = value.reshape(b * s * m, d)
    output = None
    for dy in (0, 1):
        for dx in (0, 1):
            offset = torch.tensor([dx, dy], dtype=torch.int64, device=value.device)
            corner = corner0 + offset
            inside = ((corner >= 0) & (corner < size)).all(-1)
            corner = torch.minimum(corner.clamp_min(0), size - 1)
            row = (base + corner[..., 1] * size[..., 0].view(1, 1, 1, n_levels, 1) + corner[..., 0]) * m + head
            bilinear = torch.where(offset.to(torch.bool), frac, 1 - frac).prod(-1)
            weight = (bilinear * inside).to(value.dtype) * attention_weights  # [B, Lq, M, L, P]
            samples = table[row.reshape(-1)].view(b * lq * m, n_levels * n_points, d)
            term = torch.bmm(weight.reshape(b * lq * m, 1, n_levels * n_points), samples)
            output = term if output is None else output + term
    return output.view(b, lq, m * d)
