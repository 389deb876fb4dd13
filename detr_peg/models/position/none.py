"""No positional encoding at all (``none``): the paper's "w/o" baseline."""

from __future__ import annotations

from detr_peg.config.schema import PositionConfig
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


class NoPositionalEncoding(PositionalEncoding):
    """Adds nothing and mixes nothing; attention sees only content."""


@register_encoding("none")
def build_none(cfg: PositionConfig, *, dim: int, num_levels: int, num_layers: int) -> NoPositionalEncoding:
    return NoPositionalEncoding(dim)
