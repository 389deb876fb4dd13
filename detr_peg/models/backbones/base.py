"""The contract every detr_peg backbone fulfils."""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: ``model.backbone.memory_format`` values and the layouts they stand for.
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


class Backbone(nn.Module):
    """A feature extractor returning feature maps, finest first; backbones never see masks.

    Subclasses set ``out_channels`` and ``strides`` (one per returned level, stride relative to the
    input) and implement :meth:`forward`. ``memory_format`` is the layout the body receives images in.
    """

    out_channels: list[int]
    strides: list[int]
    memory_format: torch.memory_format = torch.contiguous_format

    def set_memory_format(self, memory_format: torch.memory_format) -> None:
        """Give the body its images, and keep its conv weights, in ``memory_format`` (no per-call weight re-order)."""
        self.memory_format = memory_format
        self.to(memory_format=memory_format)

    def to_memory_format(self, images: Tensor) -> Tensor:
        """``images`` in :attr:`memory_format` (no copy when already in it)."""
        return images.contiguous(memory_format=self.memory_format)

    def train(self, mode: bool = True) -> Backbone:
        """As ``nn.Module.train``, but a BatchNorm whose weights are frozen keeps its running statistics too."""
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.weight is not None:
                module.train(mode and module.weight.requires_grad)
        return self

    def forward(self, images: Tensor) -> list[Tensor]:  # pragma: no cover - abstract
        """``[B, 3, H, W]`` normalised images, zero padding -> ``[[B, C_l, H_l, W_l], ...]`` by increasing stride."""
        raise NotImplementedError

    def output_shape(self) -> list[tuple[int, int]]:
        """``(channels, stride)`` of each returned level."""
        return list(zip(self.out_channels, self.strides))
