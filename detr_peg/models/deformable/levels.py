"""Multi-scale feature maps as one token sequence (levels flattened row-major, finest first), its layout,
valid ratios and reference points. Coordinates are normalised to ``[0, 1]`` over the padded map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LevelLayout:
    """Where each feature level sits in the flattened token sequence.

    Attributes:
        shapes: ``(H_l, W_l)`` per level as Python ints (symbolic under ``torch.export``).
        spatial_shapes: ``[L, 2]`` int64, the same sizes.
        level_start_index: ``[L]`` int64, each level's first token.
        mask: ``[B, S]`` bool, True = padding.
        valid_ratios: ``[B, L, 2]`` float32 unpadded fraction ``(w_ratio, h_ratio)``.
    """

    shapes: list[tuple[int, int]]
    spatial_shapes: Tensor
    level_start_index: Tensor
    mask: Tensor
    valid_ratios: Tensor

    @property
    def sizes(self) -> list[int]:
        """``H_l * W_l`` of each level."""
        return [h * w for h, w in self.shapes]


def valid_ratio(mask: Tensor) -> Tensor:
    """``[B, H, W]`` padding mask (image top-left) -> ``[B, 2]`` float32 unpadded fraction ``(w_ratio, h_ratio)``."""
    _, h, w = mask.shape
    valid_h = (~mask[:, :, 0]).sum(1)
    valid_w = (~mask[:, 0, :]).sum(1)
    return torch.stack([valid_w.float() / w, valid_h.float() / h], -1)


def flatten_levels(srcs: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, LevelLayout]:
    """Per-level maps ``[B, C, H_l, W_l]`` and padding masks ``[B, H_l, W_l]`` -> ``(tokens [B, S, C], layout)``."""
    # Sizes stay as they are (no int()): under torch.export they are symbolic.
    shapes = [(s.shape[-2], s.shape[-1]) for s in srcs]
    device = srcs[0].device
    tokens = torch.cat([s.flatten(2).transpose(1, 2) for s in srcs], 1)
    mask = torch.cat([m.flatten(1) for m in masks], 1)
    starts = [0]
    for h, w in shapes[:-1]:
        starts.append(starts[-1] + h * w)
    spatial_shapes = _long_tensor(shapes, device)
    level_start_index = _long_tensor(starts, device)
    valid_ratios = torch.stack([valid_ratio(m) for m in masks], 1)
    return tokens, LevelLayout(shapes, spatial_shapes, level_start_index, mask, valid_ratios)


def _long_tensor(values: list, device: torch.device) -> Tensor:
    """``torch.as_tensor(values, dtype=torch.long)`` that keeps symbolic sizes symbolic under ``torch.export``."""
    if not torch.compiler.is_exporting():
        return torch.as_tensor(values, dtype=torch.long, device=device)
    flat = [v for item in values for v in (item if isinstance(item, tuple) else (item,))]
    out = torch.stack([torch.full((), v, dtype=torch.long, device=device) for v in flat])
    return out.view(len(values), -1) if isinstance(values[0], tuple) else out


def encoder_reference_points(layout: LevelLayout) -> Tensor:
    """Every token's own pixel centre as ``[B, S, L, 2]`` float32 normalised ``(x, y)`` on each padded level.

    Normalised by the level's unpadded size, then scaled by each level's valid ratio, so a token looks at
    the same image-relative position on every level.
    """
    ratios = layout.valid_ratios
    device = ratios.device
    refs = []
    for lvl, (h, w) in enumerate(layout.shapes):
        ys = torch.arange(h, dtype=torch.float32, device=device) + 0.5
        xs = torch.arange(w, dtype=torch.float32, device=device) + 0.5
        ref_y = ys[:, None].expand(h, w).reshape(1, -1) / (ratios[:, None, lvl, 1] * h)
        ref_x = xs[None, :].expand(h, w).reshape(1, -1) / (ratios[:, None, lvl, 0] * w)
        refs.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(refs, 1)[:, :, None] * ratios[:, None]


def level_positions(pos: list[Tensor | None], level_embed: Tensor, layout: LevelLayout) -> Tensor:
    """Every token's positional term: its level's ``pos`` map (None for ``peg``/``none``) plus ``level_embed[l]``.

    Returns ``[B, S, C]``, or ``[S, C]`` (broadcast over the batch) when no level has a ``pos`` map.
    """
    if all(p is None for p in pos):
        return torch.cat([level_embed[l].expand(n, -1) for l, n in enumerate(layout.sizes)], 0)
    parts = []
    for lvl, (p, n) in enumerate(zip(pos, layout.sizes)):
        embed = level_embed[lvl].view(1, 1, -1)
        parts.append(embed.expand(layout.mask.shape[0], n, -1) if p is None else p.flatten(2).transpose(1, 2) + embed)
    return torch.cat(parts, 1)
