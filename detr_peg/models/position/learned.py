"""Learned absolute row/column embeddings (``learned``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from detr_peg.config.ranges import valid
from detr_peg.config.schema import PositionConfig
from detr_peg.errors import ConfigError
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


@dataclass
class LearnedOptions(PositionConfig):
    """``model.position`` options of ``learned``: ``num_embeddings``, the largest feature-map side encodable."""

    name: str = "learned"
    num_embeddings: int = field(default=50, metadata=valid(1, 100_000))


class LearnedPositionalEncoding(PositionalEncoding):
    """Row and column tables of ``dim / 2`` columns, as ``[x, y]`` channels over the padded grid (mask ignored).

    A feature map larger than the tables raises ConfigError naming ``model.position.num_embeddings``:
    interpolating learned tables would move every trained position. An odd ``dim`` raises ConfigError.
    """

    def __init__(self, dim: int, *, num_embeddings: int = 50) -> None:
        super().__init__(dim)
        if dim % 2:
            raise ConfigError(f"The learned positional encoding needs an even hidden_dim, got {dim}.")
        self.row_embed = nn.Embedding(num_embeddings, dim // 2)
        self.col_embed = nn.Embedding(num_embeddings, dim // 2)
        nn.init.uniform_(self.row_embed.weight)
        nn.init.uniform_(self.col_embed.weight)

    def forward(self, mask: Tensor) -> Tensor:
        b, h, w = mask.shape
        size = self.row_embed.num_embeddings
        if h > size or w > size:
            raise ConfigError(
                f"Feature map {h}x{w} is larger than the learned position tables "
                f"(model.position.num_embeddings={size}); the learned encoding needs "
                f"model.position.num_embeddings >= {max(h, w)} for this image size (train with it), "
                "or evaluate at a smaller size."
            )
        x_emb = self.col_embed(torch.arange(w, device=mask.device))  # [W, C/2]
        y_emb = self.row_embed(torch.arange(h, device=mask.device))  # [H, C/2]
        pos = torch.cat([x_emb.unsqueeze(0).expand(h, w, -1), y_emb.unsqueeze(1).expand(h, w, -1)], dim=-1)
        return pos.permute(2, 0, 1).unsqueeze(0).expand(b, -1, -1, -1)


@register_encoding("learned", options=LearnedOptions)
def build_learned(cfg: LearnedOptions, *, dim: int, num_levels: int, num_layers: int) -> LearnedPositionalEncoding:
    return LearnedPositionalEncoding(dim, num_embeddings=cfg.num_embeddings)
