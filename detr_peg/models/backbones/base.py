"""The contract every detr_peg backbone fulfils."""

from __future__ import annotations

from torch import Tensor, nn


class Backbone(nn.Module):
    """A feature extractor that returns a list of feature maps, finest first.

    Subclasses set ``out_channels`` and ``strides`` (one entry per returned
    level) in their constructor and implement :meth:`forward`. The detector
    derives each level's padding mask from the image mask and the feature size,
    so backbones never see masks.

    Attributes:
        out_channels: channels ``C_l`` of each returned level.
        strides: total stride of each returned level relative to the input.
    """

    out_channels: list[int]
    strides: list[int]

    def forward(self, images: Tensor) -> list[Tensor]:  # pragma: no cover - abstract
        """Extract features.

        Args:
            images: ``Tensor[B, 3, H, W]``, normalised, zeros in the padding.

        Returns:
            ``[Tensor[B, C_l, H_l, W_l], ...]`` for the configured levels,
            ordered by increasing stride.
        """
        raise NotImplementedError

    def output_shape(self) -> list[tuple[int, int]]:
        """``(channels, stride)`` of each returned level."""
        return list(zip(self.out_channels, self.strides))
