"""Multi-scale deformable attention with one ``grid_sample`` per level (``impl="grid_sample"`` and ``"grid_sample_sum"``).

Both write the official algorithm (``ms_deform_attn_core_pytorch``: bilinear
``F.grid_sample(padding_mode="zeros", align_corners=False)`` of every level's
value map at that level's sampling locations, weighted by the attention
weights and summed) without stacking the levels; they differ in how the
samples of one level are weighted and summed over the points:

``"grid_sample"`` (:func:`ms_deform_attn_grid_sample`)
    samples ``[B * M, D, Lq, P]`` times the weights ``[B * M, Lq, P, 1]`` as a
    batched matrix product, which PyTorch runs well forward and backward. It is
    the reference-semantics path, the one FLOPs are counted with, and the one
    for ``torch.compile(fullgraph=True)``.
``"grid_sample_sum"`` (:func:`ms_deform_attn_grid_sample_sum`)
    the grid is ``P`` rows of ``Lq`` points per (image, head), and the points
    are weighted by an elementwise product and summed (``ReduceSum``). This is
    the ONNX export path: the matrix product above becomes one ONNX ``MatMul``
    over ``B * M * Lq`` batches of ``D x P`` matrices, which ONNX Runtime runs
    one small product at a time (slower than the whole sum: docs/export.md),
    and ``GridSample`` (opset 16+) is a native operator of ONNX Runtime and
    TensorRT. Unlike the gathers of ``impl="gather"``, nothing larger than one
    level's samples (``B * M * D * Lq * P`` values, a quarter of what one
    gathered corner of all levels takes) exists at a time.

The level sizes are read from ``spatial_shapes`` when it is a list of
``(H, W)`` pairs: Python integers, or under ``torch.export`` the symbolic
sizes of the feature maps, so the exported graph keeps any image size
(``MSDeformAttn`` passes them). Given a tensor, they are read on the host (a
sync on GPUs, and a fixed size under ``torch.export``).
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
    """``Tensor[B, S, M, D]`` -> per level ``Tensor[B * M, D, H_l, W_l]``, one value map per (image, head).

    (``split``, not slicing: the backward of split is one cat, slicing would
    zero-fill the whole value gradient once per level.)
    """
    b, s, m, d = value.shape
    maps = value.permute(0, 2, 3, 1).reshape(b * m, d, s).split([h * w for h, w in shapes], dim=2)
    return [level.view(b * m, d, h, w) for level, (h, w) in zip(maps, shapes)]


def _sum_over_levels(
    value: Tensor,
    spatial_shapes: Tensor | Sequence[Sequence[int]],
    grids: Tensor,
    weigh: Callable[[Tensor, int], Tensor],
) -> Tensor:
    """``grid_sample`` (bilinear, zero padding, ``align_corners=False``) of every level's value maps at
    ``grids[level]``, weighted by ``weigh(samples, level)``, summed over the levels."""
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

    Args:
        value: ``Tensor[B, S, M, D]``.
        spatial_shapes: ``(H_l, W_l)`` per level, a list or ``Tensor[L, 2]``.
        sampling_locations: ``Tensor[B, Lq, M, L, P, 2]`` normalized ``(x, y)``.
        attention_weights: ``Tensor[B, Lq, M, L, P]``.

    Returns:
        ``Tensor[B, Lq, M * D]``.
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
    """One ``grid_sample`` per level over ``P`` rows of ``Lq`` points, weighted by an elementwise product and summed.

    The grid of a level is ``[B * M, P, Lq, 2]``, so its samples come out as
    ``[B * M, D, P, Lq]``: the weights ``[B * M, 1, P, Lq]`` multiply whole
    rows of ``Lq`` values and the sum over the points adds ``P`` rows, both
    contiguous (in ONNX Runtime a fraction of the ``Mul``/``ReduceSum``
    time of points in the last axis, where the sum reduces groups of ``P``).

    Args and returns as :func:`ms_deform_attn_grid_sample`.
    """
    b, s, m, d = value.shape
    _, lq, _, n_levels, n_points, _ = sampling_locations.shape
    # [L, B * M, P, Lq, 2] grids and [L, B * M, 1, P, Lq] weights, grouped by level for the loop.
    grids = (2 * sampling_locations - 1).permute(3, 0, 2, 4, 1, 5).reshape(n_levels, b * m, n_points, lq, 2)
    weights = attention_weights.permute(3, 0, 2, 4, 1).reshape(n_levels, b * m, 1, n_points, lq)
    # [B * M, D, P, Lq] weighted and summed over the points: [B * M, D, Lq]
    output = _sum_over_levels(value, spatial_shapes, grids, lambda sampled, level: (sampled * weights[level]).sum(2))
    return output.view(b, m * d, lq).transpose(1, 2)
