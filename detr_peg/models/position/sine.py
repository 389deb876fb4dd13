"""The sine positional encoding of DETR and Deformable-DETR (``sine``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from detr_peg.config.ranges import valid
from detr_peg.config.schema import PositionConfig
from detr_peg.errors import ConfigError
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


@dataclass
class SineOptions(PositionConfig):
    """``model.position`` options of ``sine``; ``scale`` None = ``2 * pi``; ``offset`` 0.0 (DETR), -0.5 (Deformable)."""

    temperature: float = field(default=10000.0, metadata=valid(0, low_open=True))
    normalize: bool = True
    scale: float | None = field(default=None, metadata=valid(0, low_open=True))
    offset: float = field(default=0.0, metadata=valid())


class SinePositionalEncoding(PositionalEncoding):
    """2-D sine/cosine encoding of cumulative valid-pixel counts, so padding does not change an image's encoding.

    The first ``dim / 2`` channels encode y, the rest x (interleaved sin/cos). ``offset`` is added to the
    1-based position before normalising to ``[0, scale]``. Raises ConfigError for an odd ``dim`` or a
    ``scale`` without ``normalize``.
    """

    def __init__(
        self,
        dim: int,
        *,
        temperature: float = 10000.0,
        normalize: bool = True,
        scale: float | None = None,
        offset: float = 0.0,
    ) -> None:
        super().__init__(dim)
        if dim % 2:
            raise ConfigError(f"The sine positional encoding needs an even model.transformer.hidden_dim, got {dim}.")
        if scale is not None and not normalize:
            raise ConfigError("model.position.scale is set but model.position.normalize is false; set normalize: true.")
        self.num_pos_feats = dim // 2
        self.temperature = temperature
        self.normalize = normalize
        self.scale = 2 * math.pi if scale is None else scale
        self.offset = offset

    def forward(self, mask: Tensor) -> Tensor:
        not_mask = ~mask
        y_embed = not_mask.cumsum(1, dtype=torch.float32)
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = (y_embed + self.offset) / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = (x_embed + self.offset) / (x_embed[:, :, -1:] + eps) * self.scale
        dim_t = torch.arange(self.num_pos_feats, dtype=torch.float32, device=mask.device)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.num_pos_feats)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


@register_encoding("sine", options=SineOptions)
def build_sine(cfg: SineOptions, *, dim: int, num_levels: int, num_layers: int) -> SinePositionalEncoding:
    return SinePositionalEncoding(
        dim, temperature=cfg.temperature, normalize=cfg.normalize, scale=cfg.scale, offset=cfg.offset
    )
