"""Two-stage Deformable-DETR: every encoder token proposes a box centred on its pixel, side
``0.05 * 2 ** level`` of the unpadded image. Invalid proposals (padding, a coordinate outside
``(0.01, 0.99)``) are ``+inf`` unactivated (box exactly 1.0 after sigmoid, as officially).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from detr_peg.models.deformable.levels import LevelLayout

BASE_SIZE = 0.05
VALID_MIN, VALID_MAX = 0.01, 0.99


def encoder_proposals(layout: LevelLayout) -> tuple[Tensor, Tensor]:
    """Per token: ``proposals`` ``[B, S, 4]``, unactivated cxcywh (``+inf`` if invalid), and ``valid`` ``[B, S, 1]``."""
    mask = layout.mask
    b = mask.shape[0]
    device = mask.device
    parts = []
    start = 0
    for lvl, (h, w) in enumerate(layout.shapes):
        level_mask = mask[:, start : start + h * w].view(b, h, w)
        valid_h = (~level_mask[:, :, 0]).sum(1)
        valid_w = (~level_mask[:, 0, :]).sum(1)
        ys = torch.arange(h, dtype=torch.float32, device=device)
        xs = torch.arange(w, dtype=torch.float32, device=device)
        grid = torch.stack([xs[None, :].expand(h, w), ys[:, None].expand(h, w)], -1)  # [H, W, 2] (x, y)
        scale = torch.stack([valid_w, valid_h], -1).view(b, 1, 1, 2)
        centre = (grid.unsqueeze(0) + 0.5) / scale
        size = torch.full_like(centre, BASE_SIZE * 2.0**lvl)
        parts.append(torch.cat([centre, size], -1).view(b, -1, 4))
        start += h * w
    proposals = torch.cat(parts, 1)
    valid = ((proposals > VALID_MIN) & (proposals < VALID_MAX)).all(-1, keepdim=True)
    proposals = torch.log(proposals / (1 - proposals))
    proposals = proposals.masked_fill(mask.unsqueeze(-1), float("inf"))
    proposals = proposals.masked_fill(~valid, float("inf"))
    return proposals, valid


def proposal_pos_embed(boxes_unact: Tensor, num_pos_feats: int, temperature: float = 10000.0) -> Tensor:
    """Sine embedding of unactivated cxcywh boxes ``[B, Q, 4]`` -> ``[B, Q, 4 * num_pos_feats]`` (sin/cos pairs)."""
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=boxes_unact.device)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    pos = boxes_unact.sigmoid() * (2 * math.pi)
    pos = pos[:, :, :, None] / dim_t
    return torch.stack((pos[:, :, :, 0::2].sin(), pos[:, :, :, 1::2].cos()), dim=4).flatten(2)
