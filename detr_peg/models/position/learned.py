"""Learned absolute row/column embeddings (``learned``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from detr_peg.config.ranges import FLOAT, Lookup, valid
from detr_peg.config.schema import PositionConfig
from detr_peg.errors import ConfigError
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


def _tables_memory(get: Lookup) -> float:
    return FLOAT * get("model.position.num_embeddings") * get("model.transformer.hidden_dim")


@dataclass
class LearnedOptions(PositionConfig):
    """``model.position`` options of ``learned``.

    Attributes:
        num_embeddings: rows of each embedding table, the largest feature map
            side it can encode.
    """

    name: str = "learned"
    num_embeddings: int = field(default=50, metadata=valid(1, memory=_tables_memory))


class LearnedPositionalEncoding(PositionalEncoding):
    """Two embedding tables, one per axis, concatenated as ``[x, y]`` channels.

    As in the official code the encoding indexes the padded grid (it ignores
    the mask). A feature map larger than the tables is refused with a
    :class:`~detr_peg.errors.ConfigError` naming ``model.position.num_embeddings``
    and the size needed: the tables are learned, so there is nothing to look
    up beyond them (and interpolating them would move every position the
    model was trained with). Rows beyond the largest map seen in training
    exist but were never trained.

    Args:
        dim: output channels ``C`` (even); each table has ``C / 2`` columns.
        num_embeddings: rows of each table, the largest ``H`` and ``W`` encodable.
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
