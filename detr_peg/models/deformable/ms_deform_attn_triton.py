"""Multi-scale deformable attention as Triton kernels (``impl="triton"``), forward and backward, with the
coordinate convention and zero padding of :mod:`~detr_peg.models.deformable.ms_deform_attn_function`.
Arithmetic in float32 (float64 for float64 inputs), results in the inputs' dtype, no host sync. CUDA
tensors only; with ``TRITON_INTERPRET=1`` set before ``triton`` is imported, CPU tensors in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

__all__ = ["ms_deform_attn_triton"]

# Queries per program; the backward holds more per query (the gradient row and four dot products).
_FORWARD_BLOCK_Q = 64
_BACKWARD_BLOCK_Q = 32

# Pixel coordinates are clamped to [-2, _COORD_LIMIT] before the float -> int cast, as in the pure path:
# the cast never overflows and any coordinate beyond is outside every level anyway.
_COORD_LIMIT = float(2**24)


@triton.jit
def _pixel_coordinate(loc, size, COORD_LIMIT: tl.constexpr):
    """Normalized location -> (integer corner 0, fractional offset) along one axis of size ``size``."""
    coord = loc * 2.0 - 1.0
    coord = coord + 1.0
    coord = tl.fma(coord, size * 0.5, -0.5)
    coord = tl.minimum(tl.maximum(coord, -2.0), COORD_LIMIT)
    corner = tl.floor(coord)
    return corner.to(tl.int32), coord - corner


@triton.jit
def _corner_rows(row_base, x, y, width, height, head, d, q_mask, d_mask, N_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Offsets ``[BLOCK_Q, BLOCK_D]`` of pixel ``(x, y)``'s value rows in ``[B, S, M, D]``, and whether inside."""
    inside = (x >= 0) & (x < width) & (y >= 0) & (y < height) & q_mask
    token = row_base + (y * width + x).to(tl.int64)
    offsets = ((token * N_HEADS + head) * HEAD_DIM)[:, None] + d[None, :]
    return offsets, inside[:, None] & d_mask[None, :]


@triton.jit
def _forward_kernel(
    value_ptr,
    shapes_ptr,
    start_ptr,
    loc_ptr,
    attn_ptr,
    out_ptr,
    num_queries,
    num_values,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    N_LEVELS: tl.constexpr,
    N_POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    COORD_LIMIT: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    batch = pid_bm // N_HEADS
    head = pid_bm % N_HEADS
    q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    # Row of (batch, query, head) in the [B * Lq * M] layout of locations, weights and output.
    bqm = (batch * num_queries + q).to(tl.int64) * N_HEADS + head
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=COMPUTE)
    for level in range(N_LEVELS):
        height = tl.load(shapes_ptr + 2 * level).to(tl.int32)
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
        row_base = batch.to(tl.int64) * num_values + tl.load(start_ptr + level)
        for point in range(N_POINTS):
            sample = bqm * (N_LEVELS * N_POINTS) + (level * N_POINTS + point)
            loc_x = tl.load(loc_ptr + 2 * sample, mask=q_mask, other=0.0).to(COMPUTE)
            loc_y = tl.load(loc_ptr + 2 * sample + 1, mask=q_mask, other=0.0).to(COMPUTE)
            attn = tl.load(attn_ptr + sample, mask=q_mask, other=0.0).to(COMPUTE)
            x0, fx = _pixel_coordinate(loc_x, width.to(COMPUTE), COORD_LIMIT)
            y0, fy = _pixel_coordinate(loc_y, height.to(COMPUTE), COORD_LIMIT)
            # Corners (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1).
            for corner in tl.static_range(4):
                dy = corner // 2
                dx = corner % 2
                offsets, valid = _corner_rows(
                    row_base, x0 + dx, y0 + dy, width, height, head, d, q_mask, d_mask, N_HEADS, HEAD_DIM
                )
                rows = tl.load(value_ptr + offsets, mask=valid, other=0.0).to(COMPUTE)
                wx = fx if dx == 1 else 1.0 - fx
                wy = fy if dy == 1 else 1.0 - fy
                acc += (attn * wx * wy)[:, None] * rows
    out_ptrs = out_ptr + (bqm * HEAD_DIM)[:, None] + d[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & d_mask[None, :])


@triton.jit
def _backward_kernel(
    value_ptr,
    shapes_ptr,
    start_ptr,
    loc_ptr,
    attn_ptr,
    grad_out_ptr,
    grad_value_ptr,
    grad_loc_ptr,
    grad_attn_ptr,
    num_queries,
    num_values,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    N_LEVELS: tl.constexpr,
    N_POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    COORD_LIMIT: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    batch = pid_bm // N_HEADS
    head = pid_bm % N_HEADS
    q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    qd_mask = q_mask[:, None] & d_mask[None, :]
    bqm = (batch * num_queries + q).to(tl.int64) * N_HEADS + head
    grad_out = tl.load(grad_out_ptr + (bqm * HEAD_DIM)[:, None] + d[None, :], mask=qd_mask, other=0.0).to(COMPUTE)
    for level in range(N_LEVELS):
        height = tl.load(shapes_ptr + 2 * level).to(tl.int32)
        width = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
        row_base = batch.to(tl.int64) * num_values + tl.load(start_ptr + level)
        for point in range(N_POINTS):
            sample = bqm * (N_LEVELS * N_POINTS) + (level * N_POINTS + point)
            loc_x = tl.load(loc_ptr + 2 * sample, mask=q_mask, other=0.0).to(COMPUTE)
            loc_y = tl.load(loc_ptr + 2 * sample + 1, mask=q_mask, other=0.0).to(COMPUTE)
            attn = tl.load(attn_ptr + sample, mask=q_mask, other=0.0).to(COMPUTE)
            x0, fx = _pixel_coordinate(loc_x, width.to(COMPUTE), COORD_LIMIT)
            y0, fy = _pixel_coordinate(loc_y, height.to(COMPUTE), COORD_LIMIT)
            grad_attn = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
            grad_fx = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
            grad_fy = tl.zeros((BLOCK_Q,), dtype=COMPUTE)
            for corner in tl.static_range(4):
                dy = corner // 2
                dx = corner % 2
                offsets, valid = _corner_rows(
                    row_base, x0 + dx, y0 + dy, width, height, head, d, q_mask, d_mask, N_HEADS, HEAD_DIM
                )
                rows = tl.load(value_ptr + offsets, mask=valid, other=0.0).to(COMPUTE)
                # <grad_out, value row>: zero for corners outside the level (zero padding).
                dot = tl.sum(grad_out * rows, axis=1)
                wx = fx if dx == 1 else 1.0 - fx
                wy = fy if dy == 1 else 1.0 - fy
                grad_attn += wx * wy * dot
                # d wx / d fx = +1 for the corner at x0 + 1, -1 for the one at x0 (and likewise for y).
                grad_fx += (wy * dot) if dx == 1 else -(wy * dot)
                grad_fy += (wx * dot) if dy == 1 else -(wx * dot)
                tl.atomic_add(grad_value_ptr + offsets, (attn * wx * wy)[:, None] * grad_out, mask=valid)
            tl.store(grad_attn_ptr + sample, grad_attn.to(grad_attn_ptr.dtype.element_ty), mask=q_mask)
            # d pixel coordinate / d location = W (resp. H).
            grad_x = grad_fx * attn * width.to(COMPUTE)
            grad_y = grad_fy * attn * height.to(COMPUTE)
            tl.store(grad_loc_ptr + 2 * sample, grad_x.to(grad_loc_ptr.dtype.element_ty), mask=q_mask)
            tl.store(grad_loc_ptr + 2 * sample + 1, grad_y.to(grad_loc_ptr.dtype.element_ty), mask=q_mask)


def _compute_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _grid(num_queries: int, batch: int, n_heads: int, block_q: int) -> tuple[int, int]:
    return triton.cdiv(num_queries, block_q), batch * n_heads


def _check_device(value: Tensor) -> None:
    if value.device.type != "cuda" and not isinstance(_forward_kernel, InterpretedFunction):
        raise ValueError(
            f"ms_deform_attn impl='triton' runs on CUDA tensors, got tensors on {value.device}; use "
            "impl='embedding_bag' there (or set TRITON_INTERPRET=1 before triton is imported to run "
            "Triton's interpreter on the CPU, as the tests do)."
        )


class _TritonMSDA(torch.autograd.Function):
    """Forward and backward Triton kernels; see the module docstring."""

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
        output = value.new_empty(b, lq, m * d)
        if output.numel():
            _forward_kernel[_grid(lq, b, m, _FORWARD_BLOCK_Q)](
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
                output,
                lq,
                s,
                N_HEADS=m,
                HEAD_DIM=d,
                N_LEVELS=n_levels,
                N_POINTS=n_points,
                BLOCK_Q=_FORWARD_BLOCK_Q,
                BLOCK_D=triton.next_power_of_2(d),
                COMPUTE=_compute_dtype(value.dtype),
                COORD_LIMIT=_COORD_LIMIT,
            )
        ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights = ctx.saved_tensors
        need_value, _, _, need_loc, need_attn = ctx.needs_input_grad
        b, s, m, d = value.shape
        lq, n_levels, n_points = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
        # Atomic adds accumulate in float32 (float64 for float64 values), whatever the value dtype.
        grad_value = torch.zeros(
            value.shape, dtype=torch.promote_types(value.dtype, torch.float32), device=value.device
        )
        grad_loc = torch.empty_like(sampling_locations)
        grad_attn = torch.empty_like(attention_weights)
        if grad_output.numel():
            _backward_kernel[_grid(lq, b, m, _BACKWARD_BLOCK_Q)](
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
                grad_output.contiguous(),
                grad_value,
                grad_loc,
                grad_attn,
                lq,
                s,
                N_HEADS=m,
                HEAD_DIM=d,
                N_LEVELS=n_levels,
                N_POINTS=n_points,
                BLOCK_Q=_BACKWARD_BLOCK_Q,
                BLOCK_D=triton.next_power_of_2(d),
                COMPUTE=_compute_dtype(value.dtype),
                COORD_LIMIT=_COORD_LIMIT,
            )
        else:
            grad_loc.zero_()
            grad_attn.zero_()
        return (
            grad_value.to(value.dtype) if need_value else None,
            None,
            None,
            grad_loc if need_loc else None,
            grad_attn if need_attn else None,
        )


@torch.compiler.disable
def ms_deform_attn_triton(
    value: Tensor,
    spatial_shapes: Tensor,
    level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Deformable attention with the Triton kernels; shapes as
    :func:`~detr_peg.models.deformable.ms_deform_attn_function.ms_deform_attn`, which checks them and unifies dtypes.

    Opaque to ``torch.compile``. Raises ValueError for tensors not on CUDA (unless interpreted).
    """
    _check_device(value)
    device = value.device
    return _TritonMSDA.apply(
        value.contiguous(),
        spatial_shapes.to(device=device, dtype=torch.int64).contiguous(),
        level_start_index.to(device=device, dtype=torch.int64).contiguous(),
        sampling_locations.contiguous(),
        attention_weights.contiguous(),
    )
