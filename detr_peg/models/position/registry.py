"""The positional-encoding registry."""

from __future__ import annotations

from detr_peg.config.schema import PositionConfig
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.registry import Registry

POSITION_ENCODINGS = Registry(
    "positional encoding",
    """Positional encodings by ``model.position.name``.

    Each entry is called as ``builder(cfg: PositionConfig, *, dim, num_levels,
    num_layers, default_offset)`` and returns a
    :class:`~detr_peg.models.position.base.PositionalEncoding` for tokens of
    width ``dim`` on ``num_levels`` feature levels, used by an encoder of
    ``num_layers`` layers. ``default_offset`` is the architecture's sine
    offset (DETR 0.0, Deformable-DETR -0.5), used when ``cfg.offset`` is None.
    Adding an encoding is one new file with one registered builder; the
    parametrized tests in ``tests/models/position`` then cover it.
    """,
)


def build_position_encoding(
    cfg: PositionConfig, *, dim: int, num_levels: int, num_layers: int, default_offset: float = 0.0
) -> PositionalEncoding:
    """Build the encoding named ``cfg.name`` (see :data:`POSITION_ENCODINGS`)."""
    builder = POSITION_ENCODINGS.get(cfg.name)
    return builder(cfg, dim=dim, num_levels=num_levels, num_layers=num_layers, default_offset=default_offset)
