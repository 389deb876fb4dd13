"""Multi-scale deformable attention core in pure PyTorch, :func:`ms_deform_attn`, with several
interchangeable implementations (``impl``); semantics of the official ``ms_deform_attn_core_pytorch``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from detr_peg.models.deformable.ms_deform_attn_gather import ms_deform_attn_gather
from detr_peg.models.deformable.ms_deform_attn_grid_sample import (
    ms_deform_attn_grid_sample,
    ms_deform_attn_grid_sample_sum,
)

__all__ = ["CUDA_IMPLEMENTATIONS", "IMPLEMENTATIONS", "LEVEL_SIZE_IMPLEMENTATIONS", "ms_deform_attn"]

IMPLEMENTATIONS = ("embedding_bag", "grid_sample", "grid_sample_sum", "gather")
#: Implementations that cut the values into per-level maps, so they need the level sizes as integers:
#: given a list of ``(H, W)`` they use it, given a tensor they read it on the host.
LEVEL_SIZE_IMPLEMENTATIONS = ("grid_sample", "grid_sample_sum")
#: Implementations that run on CUDA tensors only (and in Triton's interpreter for tests).
CUDA_IMPLEMENTATIONS = ("triton",)

# Coordinates are clamped to [-2, _COORD_LIMIT] before the float -> int cast so
# that the cast never overflows; any pixel coordinate beyond is outside every
# level anyway (levels are far smaller than 2**24 pixels per side).
_COORD_LIMIT = float(2**24)

# Samples per block on CPU (see _query_chunks).
_CPU_CHUNK_SAMPLES = 1 << 18


def ms_deform_attn(
    value: Tensor,
    spatial_shapes: Tensor | Sequence[Sequence[int]],
    level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    *,
    impl: str = "embedding_bag",
) -> Tensor:
    """Multi-scale deformable attention: weighted bilinear samples of multi-level values.

    ``value`` ``[B, S, n_heads, head_dim]`` (levels flattened row-major); ``spatial_shapes`` ``[L, 2]``
    int64 ``(H_l, W_l)`` or a list of pairs; ``level_start_index`` ``[L]`` int64;
    ``sampling_locations`` ``[B, Lq, n_heads, L, P, 2]`` normalised ``(x, y)`` with ``grid_sample``
    ``align_corners=False`` semantics, zeros outside; ``attention_weights`` ``[B, Lq, n_heads, L, P]``,
    already normalised. Returns ``[B, Lq, n_heads * head_dim]`` in the promoted float dtype.
    Raises ValueError for an unknown ``impl``, bad shapes or ``triton`` off CUDA; RuntimeError for
    ``triton`` without the package.
    """
    if impl not in IMPLEMENTATIONS + CUDA_IMPLEMENTATIONS:
        raise ValueError(
            f"Unknown ms_deform_attn impl {impl!r}: valid are {', '.join(IMPLEMENTATIONS + CUDA_IMPLEMENTATIONS)}."
        )
    _check_shapes(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    dtype = torch.promote_types(torch.promote_types(value.dtype, sampling_locations.dtype), attention_weights.dtype)
    value = value.to(dtype)
    sampling_locations = sampling_locations.to(dtype)
    attention_weights = attention_weights.to(dtype)
    if impl == "grid_sample":
        return ms_deform_attn_grid_sample(value, spatial_shapes, sampling_locations, attention_weights)
    if impl == "grid_sample_sum":
        return ms_deform_attn_grid_sample_sum(value, spatial_shapes, sampling_locations, attention_weights)
    if not isinstance(spatial_shapes, Tensor):
        spatial_shapes = torch.as_tensor(spatial_shapes, dtype=torch.int64, device=value.device)
    if impl == "triton":
        return _triton_function()(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    if impl == "gather":
        return ms_deform_attn_gather(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    return _embedding_bag_msda(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


@torch.compiler.disable
def _embedding_bag_msda(*args: Tensor) -> Tensor:
    """Kept out of ``torch.compile``: its backward builds sparse CSR tensors, which Dynamo cannot trace."""
    return _EmbeddingBagMSDA.apply(*args)


def _triton_function():
    """:func:`ms_deform_attn_triton`, imported on first use (``triton`` is optional)."""
    try:
        from detr_peg.models.deformable.ms_deform_attn_triton import ms_deform_attn_triton
    except ModuleNotFoundError as error:
        if error.name != "triton" and not (error.name or "").startswith("triton."):
            raise
        raise RuntimeError(
            "ms_deform_attn impl='triton' needs the triton package (pip install triton); "
            "use impl='embedding_bag' without it."
        ) from None
    return ms_deform_attn_triton


def _check_shapes(
    value: Tensor, spatial_shapes, level_start_index: Tensor, sampling_locations: Tensor, attention_weights: Tensor
) -> None:
    """Cheap shape checks that need no host sync."""
    if value.dim() != 4:
        raise ValueError(f"value must be [B, S, n_heads, head_dim], got shape {tuple(value.shape)}.")
    if sampling_locations.dim() != 6 or sampling_locations.shape[-1] != 2:
        raise ValueError(
            f"sampling_locations must be [B, Lq, n_heads, L, P, 2], got shape {tuple(sampling_locations.shape)}."
        )
    b, lq, m, n_levels, n_points, _ = sampling_locations.shape
    if value.shape[0] != b or value.shape[2] != m:
        raise ValueError(
            f"value {tuple(value.shape)} and sampling_locations {tuple(sampling_locations.shape)} "
            "disagree on batch size or number of heads."
        )
    if tuple(attention_weights.shape) != (b, lq, m, n_levels, n_points):
        raise ValueError(
            f"attention_weights must be [B, Lq, n_heads, L, P] = {(b, lq, m, n_levels, n_points)}, "
            f"got {tuple(attention_weights.shape)}."
        )
    if isinstance(spatial_shapes, Tensor) and (spatial_shapes.dim() != 2 or spatial_shapes.shape[1] != 2):
        raise ValueError(f"spatial_shapes must be [L, 2] (H, W), got shape {tuple(spatial_shapes.shape)}.")
    n_shapes = spatial_shapes.shape[0] if isinstance(spatial_shapes, Tensor) else len(spatial_shapes)
    if n_shapes != n_levels or level_start_index.shape[0] != n_levels:
        raise ValueError(
            f"spatial_shapes ({n_shapes} levels) and level_start_index "
            f"({level_start_index.shape[0]} levels) must match the {n_levels} levels "
            "of sampling_locations."
        )


# ----------------------------------------------------------------------------------------------
# impl="embedding_bag"
# ----------------------------------------------------------------------------------------------


def _bilinear_corners(
    spatial_shapes: Tensor,
    level_start_index: Tensor,
    sampling_locations: Tensor,
    num_values: int,
    index_dtype: torch.dtype,
    index_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Row indices and bilinear weights of the four corners of every sample, laid out planar for long contiguous rows.

    Returns ``(index, weight, outside)``: ``index`` ``[B, Lq, M, 2 (y), 2 (x), L, P]`` rows of
    ``value.reshape(B * S * M, head_dim)``; ``weight`` ``[2 (x, y), 2 (corner), B, Lq, M, L, P]``, zero
    where ``outside`` (bool, same layout) marks a corner outside its level.
    """
    b, lq, m, n_levels, n_points, _ = sampling_locations.shape
    device = sampling_locations.device
    # Reduced-precision locations are not precise enough for pixel coordinates.
    dtype = torch.float64 if sampling_locations.dtype == torch.float64 else torch.float32
    size = spatial_shapes.flip(-1).t()  # [2 (W, H), L]

    def per_level(t: Tensor) -> Tensor:
        # [2, L] -> [2, 1, 1, M, L, P], materialised so that elementwise ops see long
        # contiguous inner rows instead of a broadcast over the last dimension.
        return t[:, None, None, None, :, None].expand(2, 1, 1, m, n_levels, n_points).contiguous()

    clamped, weight, outside = _clamped_corners(sampling_locations, size, per_level, index_dtype, dtype)
    # Flattened row of value.reshape(B * S * M, D): ((b * S + start_l + y * W_l + x) * M + m).
    stride = torch.stack([torch.full_like(size[0], m), size[0] * m]).to(index_dtype)  # x -> M, y -> W * M
    clamped.mul_(per_level(stride)[:, None])
    row_base = (
        (torch.arange(b, device=device) * (num_values * m))[:, None, None]
        + torch.arange(m, device=device)[:, None]
        + (level_start_index * m)
    )  # [B, M, L]
    clamped[1].add_(row_base.to(index_dtype)[:, None, :, :, None].expand(b, 1, m, n_levels, n_points).contiguous())
    index = (
        index_out
        if index_out is not None
        else torch.empty((b, lq, m, 2, 2, n_levels, n_points), dtype=index_dtype, device=device)
    )
    torch.add(clamped[1][:, None], clamped[0][None, :], out=index.permute(3, 4, 0, 1, 2, 5, 6))
    return index, weight, outside


def _clamped_corners(
    sampling_locations: Tensor, size: Tensor, per_level, index_dtype: torch.dtype, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """Integer corners clamped into each level ``[2 (x, y), 2, B, Lq, M, L, P]``, their weights, which were outside."""
    b, lq, m, n_levels, n_points, _ = sampling_locations.shape
    device = sampling_locations.device
    # Pixel coordinate ix = loc * W - 0.5, computed the way grid_sample does on
    # CPU and CUDA, ((2 * loc - 1) + 1) * (W / 2) - 0.5 with a fused multiply-add,
    # so that floor() picks the same cell for points exactly on a pixel center
    # and the location gradient matches there too.
    xy = torch.empty((2, b, lq, m, n_levels, n_points), dtype=dtype, device=device)
    torch.mul(sampling_locations.permute(5, 0, 1, 2, 3, 4), 2, out=xy)
    xy.sub_(1).add_(1)
    torch.addcmul(torch.full((), -0.5, dtype=dtype, device=device), xy, per_level(size.to(dtype) / 2), out=xy)
    xy.clamp_(-2.0, _COORD_LIMIT)
    corner0 = xy.floor()
    frac = xy.sub_(corner0)

    # Integer corner coordinates [2 (x, y), 2 (corner 0, 1), ...], clamped into the level.
    corner = corner0.to(index_dtype)[:, None] + torch.arange(2, dtype=index_dtype, device=device).view(
        1, 2, 1, 1, 1, 1, 1
    )
    clamped = corner.clamp_min(0)
    torch.minimum(clamped, per_level((size - 1).to(index_dtype))[:, None], out=clamped)
    outside = clamped != corner
    del corner

    weight = torch.empty((2, 2, b, lq, m, n_levels, n_points), dtype=dtype, device=device)
    torch.sub(torch.ones((), dtype=dtype, device=device), frac, out=weight[:, 0])
    weight[:, 1].copy_(frac)
    weight.masked_fill_(outside, 0.0)
    return clamped, weight, outside


def _sample_weights(weight: Tensor, attention_weights: Tensor, dtype: torch.dtype) -> Tensor:
    """Per-corner weights ``wy * wx * attention`` in bag layout ``[B, Lq, M, 2, 2, L, P]``."""
    wy_attn = weight[1] * attention_weights  # [2 (y corner), B, Lq, M, L, P]
    b, lq, m, n_levels, n_points = attention_weights.shape
    out = torch.empty((b, lq, m, 2, 2, n_levels, n_points), dtype=dtype, device=weight.device)
    torch.mul(wy_attn[:, None], weight[0][None, :], out=out.permute(3, 4, 0, 1, 2, 5, 6))
    return out


def _index_dtype(num_rows: int) -> torch.dtype:
    return torch.int32 if num_rows < 2**31 else torch.int64


def _query_chunks(sampling_locations: Tensor) -> list[slice]:
    """Query ranges processed at once: all on GPUs; on CPU blocks of ``_CPU_CHUNK_SAMPLES`` samples, kept in cache."""
    b, lq, m, n_levels, n_points, _ = sampling_locations.shape
    if sampling_locations.device.type != "cpu":
        return [slice(0, lq)]
    step = max(1, _CPU_CHUNK_SAMPLES // max(1, b * m * n_levels * n_points))
    return [slice(start, min(start + step, lq)) for start in range(0, lq, step)] or [slice(0, 0)]


class _EmbeddingBagMSDA(torch.autograd.Function):
    """Deformable attention as one ``embedding_bag`` per query block, with a closed-form backward."""

    @staticmethod
    def forward(
        ctx,
        value: Tensor,
        spatial_shapes: Tensor,
        level_start_index: Tensor,
        sampling_locations: Tensor,
        attention_weights: Tensor,
    ) -> Tensor:
        b, s, m, d = value.shape
        lq, n_levels, n_points = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
        bag_size = n_levels * n_points * 4
        table = value.reshape(b * s * m, d)
        index_dtype = _index_dtype(table.shape[0])
        output = value.new_empty(b, lq, m * d)
        for chunk in _query_chunks(sampling_locations):
            index, weight, _ = _bilinear_corners(
                spatial_shapes, level_start_index, sampling_locations[:, chunk], s, index_dtype
            )
            sample_weight = _sample_weights(weight, attention_weights[:, chunk], value.dtype)
            bags = index.shape[0] * index.shape[1] * m
            sampled = F.embedding_bag(
                index.view(bags, bag_size), table, per_sample_weights=sample_weight.view(bags, bag_size), mode="sum"
            )
            output[:, chunk] = sampled.view(b, -1, m * d)
        ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights = ctx.saved_tensors
        need_value, _, _, need_loc, need_attn = ctx.needs_input_grad
        b, s, m, d = value.shape
        n_levels, n_points = sampling_locations.shape[3], sampling_locations.shape[4]
        bag_size = n_levels * n_points * 4
        # The sparse kernels below have no reduced-precision versions everywhere.
        work_dtype = torch.promote_types(value.dtype, torch.float32)
        table = value.reshape(b * s * m, d).to(work_dtype)
        grad_output = grad_output.to(work_dtype)
        chunks = _query_chunks(sampling_locations)
        # The value row of every corner, written in place by _bilinear_corners block after block;
        # 32-bit where both the rows and the corners of a block fit (the CSR patterns of
        # _sampled_dots count corners in the same dtype), which makes _value_scatter's sort faster.
        max_bags = b * max(c.stop - c.start for c in chunks) * m
        index_dtype = _index_dtype(max(table.shape[0], max_bags * bag_size + 1))
        corner_rows = torch.empty(max_bags * bag_size, dtype=index_dtype, device=value.device)
        grad_value = torch.zeros_like(table) if need_value else None
        grad_loc = torch.empty_like(sampling_locations) if need_loc else None
        grad_attn = torch.empty_like(attention_weights) if need_attn else None
        size = None
        if need_loc:
            size = (
                spatial_shapes.flip(-1)
                .t()
                .to(work_dtype)[:, None, None, None, :, None]
                .expand(2, 1, 1, m, n_levels, n_points)
                .contiguous()
            )  # [2 (W, H), 1, 1, M, L, P]

        for chunk in chunks:
            attn = attention_weights[:, chunk]
            lq = chunk.stop - chunk.start
            nnz = b * lq * m * bag_size
            index_out = corner_rows[:nnz].view(b, lq, m, 2, 2, n_levels, n_points)
            _, weight, outside = _bilinear_corners(
                spatial_shapes, level_start_index, sampling_locations[:, chunk], s, index_dtype, index_out
            )
            flat_index = corner_rows[:nnz]
            grad_bags = grad_output[:, chunk].reshape(b * lq * m, d)
            if need_loc or need_attn:
                # dots[y corner, x corner, b, q, m, l, p] = <grad_out[b, q, m], value row of that corner>,
                # zero where the corner is outside the level.
                dots = _sampled_dots(grad_bags, table, flat_index, bag_size)
                dots = dots.view(b, lq, m, 2, 2, n_levels, n_points).permute(3, 4, 0, 1, 2, 5, 6)
                dots.masked_fill_(outside[1][:, None] | outside[0][None, :], 0.0)
                wx, wy = weight[0], weight[1]
                by_y = dots[:, 0] * wx[0] + dots[:, 1] * wx[1]  # [2 (y corner), ...], summed over x corners
                if need_attn:
                    grad_attn[:, chunk] = by_y[0] * wy[0] + by_y[1] * wy[1]
                if need_loc:
                    # d weight / d frac = -1 for corner 0 and +1 for corner 1; d frac / d loc = W (resp. H).
                    by_x = dots[0] * wy[0] + dots[1] * wy[1]  # [2 (x corner), ...]
                    grad_frac = torch.stack([by_x[1] - by_x[0], by_y[1] - by_y[0]])
                    grad_frac.mul_(attn).mul_(size)
                    grad_loc[:, chunk] = grad_frac.permute(1, 2, 3, 4, 5, 0)
            if need_value:
                sample_weight = _sample_weights(weight, attn, work_dtype).view(-1)
                scatter = _value_scatter(flat_index, sample_weight, bag_size, table.shape[0])
                # addmm into its own input accumulates in place (beta = 1: no copy, no extra zero-fill).
                torch.addmm(grad_value, scatter, grad_bags, out=grad_value)
        if need_value:
            grad_value = grad_value.view(b, s, m, d).to(value.dtype)
        return grad_value, None, None, grad_loc, grad_attn


def _value_scatter(flat_index: Tensor, sample_weight: Tensor, bag_size: int, num_rows: int) -> Tensor:
    """The transposed sampling matrix ``[num_rows, num_bags]`` in CSR form, rows sorted.

    Entry ``(flat_index[k], k // bag_size)`` holds ``sample_weight[k]``, so ``scatter @ grad_bags``
    adds every corner's weighted bag gradient to its value row; duplicate entries stay separate terms.
    """
    rows, order = torch.sort(flat_index, stable=True)
    crow = torch.zeros(num_rows + 1, dtype=torch.int64, device=flat_index.device)
    torch.cumsum(torch.bincount(rows, minlength=num_rows), 0, out=crow[1:])
    with warnings.catch_warnings():
        # Sparse CSR tensors announce their "beta" status once per process.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            crow,
            order.div(bag_size, rounding_mode="floor"),
            sample_weight[order],
            size=(num_rows, flat_index.shape[0] // bag_size),
            check_invariants=False,
        )


def _sampled_dots(grad_bags: Tensor, table: Tensor, flat_index: Tensor, bag_size: int) -> Tensor:
    """``out[k] = <grad_bags[k // bag_size], table[flat_index[k]]>`` without gathering the rows."""
    num_bags = grad_bags.shape[0]
    crow = torch.arange(0, num_bags * bag_size + 1, bag_size, dtype=flat_index.dtype, device=flat_index.device)
    with warnings.catch_warnings():
        # Sparse CSR tensors announce their "beta" status once per process.
        warnings.simplefilter("ignore", UserWarning)
        # beta=0 still multiplies the pattern's values by 0, so they must be finite.
        pattern = torch.sparse_csr_tensor(
            crow,
            flat_index,
            torch.zeros_like(flat_index, dtype=table.dtype),
            size=(num_bags, table.shape[0]),
            check_invariants=False,
        )
        return torch.sparse.sampled_addmm(pattern, grad_bags, table.t(), beta=0.0).values()
