"""The positional-encoding registry: one registration per encoding, with its options."""

from __future__ import annotations

from collections.abc import Callable

from detr_peg.config.options import register_encoding_options
from detr_peg.config.schema import PositionConfig
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.registry import Registry

POSITION_ENCODINGS = Registry(
    "positional encoding",
    """Positional encodings by ``model.position.name``.

    Each entry is called as ``builder(cfg, *, dim, num_levels, num_layers)``
    with ``cfg`` the encoding's own options (a subclass of ``PositionConfig``)
    and returns a :class:`~detr_peg.models.position.base.PositionalEncoding`
    for tokens of width ``dim`` on ``num_levels`` feature levels, used by an
    encoder of ``num_layers`` layers. Register with :func:`register_encoding`.
    """,
)

Builder = Callable[..., PositionalEncoding]


def register_encoding(name: str, *, options: type[PositionConfig] = PositionConfig) -> Callable[[Builder], Builder]:
    """Decorator registering an encoding builder as ``model.position.name: name`` with its ``options`` dataclass."""
    add = POSITION_ENCODINGS.register(name)  # a name that is no name is refused at once

    def decorator(builder: Builder) -> Builder:
        register_encoding_options(name, options)
        return add(builder)

    return decorator


def build_position_encoding(cfg: PositionConfig, *, dim: int, num_levels: int, num_layers: int) -> PositionalEncoding:
    """Build the encoding named ``cfg.name`` (see :data:`POSITION_ENCODINGS`)."""
    return POSITION_ENCODINGS.build(cfg.name, PositionalEncoding, cfg, dim=dim, num_levels=num_levels,
                                    num_layers=num_layers)  # fmt: skip
