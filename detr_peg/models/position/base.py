"""The interface of every positional encoding: additive ones (``sine``, ``learned``) return a ``pos`` map
added to attention queries and keys (never values); generated ones (``peg``) change the tokens in
:meth:`PositionalEncoding.mix` between encoder layers. Transformers always call both.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """Base class for an encoding of token width ``dim``; by default it adds nothing and mixes nothing."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, mask: Tensor) -> Tensor | None:
        """``mask`` ``[B, H, W]`` (True = padding) -> ``pos`` ``[B, C, H, W]`` float32, or None to add nothing."""
        return None

    def mixes_after(self, layer: int) -> bool:
        """Whether :meth:`mix` changes the tokens after encoder layer ``layer`` (``-1``: before the first)."""
        return False

    def mix(
        self,
        layer: int,
        tokens: Tensor,
        mask: Tensor | None,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """Transform encoder tokens after layer ``layer`` (``-1``: input); called only where :meth:`mixes_after`.

        ``tokens`` ``[B, N, C]``, the levels' row-major grids concatenated; ``mask`` ``[B, N]`` bool,
        True = padding, or None; ``spatial_shapes`` ``(H_l, W_l)`` summing to ``N``. Returns ``[B, N, C]``.
        """
        return tokens
