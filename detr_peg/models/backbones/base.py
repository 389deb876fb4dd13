"""The contract every detr_peg backbone fulfils."""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: ``model.backbone.memory_format`` values and the layouts they stand for.
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


class Backbone(nn.Module):
    """A feature extractor that returns a list of feature maps, finest first.

    Subclasses set ``out_channels`` and ``strides`` (one entry per returned
    level) in their constructor and implement :meth:`forward`. The detector
    derives each level's padding mask from the image mask and the feature size,
    so backbones never see masks.

    Attributes:
        out_channels: channels ``C_l`` of each returned level.
        strides: total stride of each returned level relative to the input.
        memory_format: layout the images are given to the body in
            (``torch.contiguous_format`` or ``torch.channels_last``); the
            returned maps keep the body's layout (``Tensor`` shapes are the same).
    """

    out_channels: list[int]
    strides: list[int]
    memory_format: torch.memory_format = torch.contiguous_format

    def set_memory_format(self, memory_format: torch.memory_format) -> None:
        """Give the body its images in ``memory_format`` and keep its convolution weights in it too.

        Weights in the layout of the images spare the convolutions a
        re-ordered copy of the weight in every forward and of its gradient in
        every backward; the values are unchanged.
        """
        self.memory_format = memory_format
        self.to(memory_format=memory_format)

    def to_memory_format(self, images: Tensor) -> Tensor:
        """``images`` in :attr:`memory_format` (no copy when already in it)."""
        return images.contiguous(memory_format=self.memory_format)

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
