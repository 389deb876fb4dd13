"""The interface shared by every positional encoding.

Two kinds of encoding exist and one interface fits both:

* **Additive** encodings (``sine``, ``learned``) return a ``pos`` map from the
  padding mask; the transformer adds it to the queries and keys of attention
  (never to the values), as in the official DETR and Deformable-DETR.
* **Generated** encodings (``peg``) return no ``pos`` map. Instead the encoder
  calls :meth:`PositionalEncoding.mix` between its layers, and the encoding
  changes the tokens themselves.

``none`` does neither. A transformer therefore always calls both methods and
never needs to know which encoding it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """Base class; the default implementation adds nothing and mixes nothing.

    Attributes:
        dim: token width ``C`` the encoding is built for.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, mask: Tensor) -> Tensor | None:
        """The additive ``pos`` map of one feature level.

        Args:
            mask: ``Tensor[B, H, W]`` bool, True = padding.

        Returns:
            ``Tensor[B, C, H, W]`` float32 to add to queries and keys, or
            ``None`` when the encoding adds nothing.
        """
        return None

    def mixes_after(self, layer: int) -> bool:
        """Whether :meth:`mix` changes the tokens after encoder layer ``layer``.

        ``layer == -1`` asks about the tokens before the first layer.
        """
        return False

    def mix(
        self,
        layer: int,
        tokens: Tensor,
        mask: Tensor | None,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        """Transform encoder tokens after encoder layer ``layer``.

        Called by every encoder after each of its layers (and with
        ``layer=-1`` before the first one) when :meth:`mixes_after` is true.

        Args:
            layer: 0-based encoder layer index, or -1 for the encoder input.
            tokens: ``Tensor[B, N, C]``, the levels' ``H_l * W_l`` row-major
                grids concatenated in order.
            mask: ``Tensor[B, N]`` bool, True = padding, or ``None``.
            spatial_shapes: ``(H_l, W_l)`` of each level; their products sum to ``N``.

        Returns:
            ``Tensor[B, N, C]``.
        """
        return tokens
