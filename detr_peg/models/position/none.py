"""No positional encoding at all (``none``): the paper's "w/o" baseline."""

from __future__ import annotations

from detr_peg.config.schema import PositionConfig
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import POSITION_ENCODINGS


class NoPositionalEncoding(PositionalEncoding):
    """Adds nothing and mixes nothing; attention sees only content."""


@POSITION_ENCODINGS.register("none")
def build_none(cfg: PositionConfig, *, dim: int, num_levels: int, num_layers: int, default_offset: float) -> NoPositionalEncoding:
    return NoPositionalEncoding(dim)
