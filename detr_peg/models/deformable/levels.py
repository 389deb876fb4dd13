"""Multi-scale feature maps as one token sequence: layout, valid ratios, reference points.

Deformable-DETR flattens every feature level ``l`` (``Tensor[B, C, H_l, W_l]``,
row-major) and concatenates the levels, finest first, into one sequence of
``S = sum_l H_l * W_l`` tokens. :class:`LevelLayout` records where each level
sits in that sequence, once per forward pass, both as Python integers (for
slicing and reshaping without host synchronisation) and as the tensors the
multi-scale deformable attention expects.

Coordinates are normalised to ``[0, 1]`` over the **padded** feature map, with
``(0, 0)`` the top-left corner; ``valid_ratios`` (``w``, ``h`` order) convert
between "relative to the unpadded image" and "relative to the padded map".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LevelLayout:
    """Where each feature level sits in the flattened token sequence.

    Attributes:
        shapes: ``(H_l, W_l)`` of each level, as Python integers.
        spatial_shapes: ``Tensor[L, 2]`` int64, the same ``(H_l, W_l)``.
        level_start_index: ``Tensor[L]`` int64, index of each level's first
            token (``0, H_0 W_0, H_0 W_0 + H_1 W_1, ...``).
        mask: ``Tensor[B, S]`` bool, True = padding.
        valid_ratios: ``Tensor[B, L, 2]`` float32, the unpadded fraction of
            each level as ``(w_ratio, h_ratio)``.
    """

    shapes: list[tuple[int, int]]
    spatial_shapes: Tensor
    level_start_index: Tensor
    mask: Tensor
    valid_ratios: Tensor

    @property
    def num_tokens(self) -> int:
        """``S``, the total number of tokens."""
        return sum(h * w for h, w in self.shapes)

    @property
    def sizes(self) -> list[int]:
        """``H_l * W_l`` of each level."""
        return [h * w for h, w in self.shapes]


def valid_ratio(mask: Tensor) -> Tensor:
    """The unpadded fraction of a padded feature map, per image.

    Images sit in the top-left corner, so the first column counts the valid
    rows and the first row counts the valid columns.

    Args:
        mask: ``Tensor[B, H, W]`` bool, True = padding.

    Returns:
        ``Tensor[B, 2]`` float32 as ``(w_ratio, h_ratio)``.
    """
    _, h, w = mask.shape
    valid_h = (~mask[:, :, 0]).sum(1)
    valid_w = (~mask[:, 0, :]).sum(1)
    return torch.stack([valid_w.float() / w, valid_h.float() / h], -1)


def flatten_levels(srcs: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, LevelLayout]:
    """Flatten and concatenate feature levels into one token sequence.

    Args:
        srcs: per level ``Tensor[B, C, H_l, W_l]``.
        masks: per level ``Tensor[B, H_l, W_l]`` bool, True = padding.

    Returns:
        ``(tokens, layout)`` with ``tokens`` ``Tensor[B, S, C]``.
    """
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
    """``torch.as_tensor(values, dtype=torch.long)``, keeping symbolic sizes symbolic under ``torch.export``.

    (``as_tensor`` would read them as the traced example's numbers and fix the
    exported graph to that image size.)
    """
    if not torch.compiler.is_exporting():
        return torch.as_tensor(values, dtype=torch.long, device=device)
    flat = [v for item in values for v in (item if isinstance(item, tuple) else (item,))]
    out = torch.stack([torch.full((), v, dtype=torch.long, device=device) for v in flat])
    return out.view(len(values), -1) if isinstance(values[0], tuple) else out


def encoder_reference_points(layout: LevelLayout) -> Tensor:
    """Reference points of the encoder queries: every token's own pixel centre.

    The centre of pixel ``(i, j)`` of level ``l``, normalised by the level's
    *unpadded* size and then scaled by each level's valid ratio, so that a
    token looks at the same image-relative position on every level.

    Args:
        layout: the token layout.

    Returns:
        ``Tensor[B, S, L, 2]`` float32 as normalised ``(x, y)``.
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
    """The positional term of every token: its level's ``pos`` map plus the level embedding.

    Args:
        pos: per level ``Tensor[B, C, H_l, W_l]`` from the positional encoding,
            or ``None`` for encodings that add nothing (``peg``, ``none``).
        level_embed: ``Tensor[L, C]``, one learned vector per level.
        layout: the token layout.

    Returns:
        ``Tensor[B, S, C]``, or ``Tensor[S, C]`` (broadcast over the batch)
        when no level has a ``pos`` map.
    """
    if all(p is None for p in pos):
        return torch.cat([level_embed[l].expand(n, -1) for l, n in enumerate(layout.sizes)], 0)
    parts = []
    for lvl, (p, n) in enumerate(zip(pos, layout.sizes)):
        embed = level_embed[lvl].view(1, 1, -1)
        parts.append(embed.expand(layout.mask.shape[0], n, -1) if p is None else p.flatten(2).transpose(1, 2) + embed)
    return torch.cat(parts, 1)
