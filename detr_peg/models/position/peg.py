"""CPVT's Positional Encoding Generator for detection (``peg``).

A PEG reshapes encoder tokens back to their 2-D grid and adds a
depthwise-convolution-generated encoding to them::

    x = tokens as Tensor[B, C, H, W], padded positions set to 0
    out = x + ReLU(BatchNorm2d(DepthwiseConv_kxk(x)))          (no conv bias)
    padded positions of out = the input tokens, unchanged

Mask handling, decided deliberately (the published ``PEGDetection`` snippet
leaves these points open):

* **Padded tokens are zeroed before the convolution.** The convolution's zero
  padding at the border is what gives the network absolute position; zeroing
  the padded tokens makes every image's *own* border that anchor, so an image
  gets the same encoding whether it is alone or padded next to a larger image.
* **Padded tokens come out unchanged** (the input values are written back), so
  a PEG never writes into padding and stacking PEGs cannot leak through it.
* **BatchNorm statistics in training use valid tokens only** (a masked batch
  norm with the exact update rule of ``nn.BatchNorm2d``), so batch statistics
  do not depend on how much padding a batch has. In eval mode the running
  statistics are used, which is per-position and needs no masking.

Placement: ``peg_layers`` lists the encoder layers after which a PEG is
applied (``-1``: before the first layer); each placement and each feature
level has its own PEG, so levels with different statistics are not forced to
share a BatchNorm. No sine or learned encoding is added anywhere: the PEG is
the only source of position for the image tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.config.ranges import FLOAT, Lookup, valid
from detr_peg.config.schema import PositionConfig
from detr_peg.errors import ConfigError
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


def _kernel_memory(get: Lookup) -> float:
    """One depthwise ``k x k`` kernel per channel."""
    return FLOAT * get("model.position.peg_kernel") ** 2 * get("model.transformer.hidden_dim")


@dataclass
class PEGOptions(PositionConfig):
    """``model.position`` options of ``peg``.

    Attributes:
        peg_layers: 0-based encoder layer indices after which a PEG is applied
            (``[0]``: after the first layer, as in CPVT; ``-1``: before the first).
        peg_kernel: depthwise convolution kernel size (odd).
    """

    name: str = "peg"
    peg_layers: list[int] = field(default_factory=lambda: [0], metadata=valid(-1, non_empty=True))
    peg_kernel: int = field(default=3, metadata=valid(1, memory=_kernel_memory))


def masked_batch_norm(x: Tensor, valid: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """Training-mode batch norm whose statistics come from valid positions only.

    Follows ``nn.BatchNorm2d`` exactly (biased variance to normalise, unbiased
    variance for the running estimate, ``momentum`` or cumulative averaging
    when ``momentum`` is None, ``num_batches_tracked``), without host syncs.

    Args:
        x: ``Tensor[B, C, H, W]``.
        valid: ``Tensor[B, 1, H, W]`` bool, True = valid (not padding).
        bn: the module holding the affine parameters and running statistics.

    Returns:
        ``Tensor[B, C, H, W]``; padded positions hold normalised garbage that
        the caller discards.
    """
    weight = valid.to(x.dtype)
    count = weight.sum()
    mean = (x * weight).sum(dim=(0, 2, 3)) / count.clamp(min=1)
    centered = x - mean.view(1, -1, 1, 1)
    var = (centered.square() * weight).sum(dim=(0, 2, 3)) / count.clamp(min=1)
    if bn.track_running_stats:
        with torch.no_grad():
            bn.num_batches_tracked.add_(1)
            momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
            unbiased = var * (count / (count - 1).clamp(min=1))
            bn.running_mean.lerp_(mean.detach().to(bn.running_mean.dtype), momentum)
            bn.running_var.lerp_(unbiased.detach().to(bn.running_var.dtype), momentum)
    out = centered * torch.rsqrt(var + bn.eps).view(1, -1, 1, 1)
    if bn.affine:
        out = out * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    return out


class PEG(nn.Module):
    """One PEGDetection block on a 2-D grid of tokens.

    Parameters: ``C * k * k`` depthwise convolution weights (no bias) and the
    ``2 * C`` BatchNorm affine parameters.

    Args:
        dim: channels ``C``.
        kernel_size: odd depthwise kernel size ``k`` (3 in the paper).
    """

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ConfigError(f"model.position.peg_kernel must be a positive odd number, got {kernel_size}.")
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Apply the PEG.

        Args:
            x: ``Tensor[B, C, H, W]`` tokens on their grid.
            mask: ``Tensor[B, H, W]`` bool, True = padding, or ``None``.

        Returns:
            ``Tensor[B, C, H, W]``; padded positions equal ``x`` there.
        """
        if mask is None:
            return x + F.relu(self.norm(self.proj(x)))
        valid = ~mask.unsqueeze(1)
        zeroed = x * valid
        y = self.proj(zeroed)
        y = masked_batch_norm(y, valid, self.norm) if self.training else self.norm(y)
        return torch.where(valid, zeroed + F.relu(y), x)


class PEGEncoding(PositionalEncoding):
    """PEGs after the configured encoder layers, one per layer and level.

    State-dict keys read ``pegs.layer{i}.level{l}.proj.weight`` and
    ``pegs.layer{i}.level{l}.norm.*`` (``layer-1`` for the encoder input).

    Args:
        dim: token width ``C``.
        num_levels: feature levels in the token sequence.
        layers: encoder layer indices after which to apply a PEG
            (-1 = before the first layer).
        kernel_size: depthwise kernel size.
    """

    def __init__(self, dim: int, *, num_levels: int, layers: Sequence[int], kernel_size: int = 3) -> None:
        super().__init__(dim)
        self.layers = sorted(set(layers))
        self.num_levels = num_levels
        self.pegs = nn.ModuleDict(
            {
                f"layer{i}": nn.ModuleDict({f"level{l}": PEG(dim, kernel_size) for l in range(num_levels)})
                for i in self.layers
            }
        )

    def mixes_after(self, layer: int) -> bool:
        return layer in self.layers

    def mix(
        self,
        layer: int,
        tokens: Tensor,
        mask: Tensor | None,
        spatial_shapes: Sequence[tuple[int, int]],
    ) -> Tensor:
        if layer not in self.layers:
            return tokens
        if len(spatial_shapes) != self.num_levels:
            raise ValueError(f"PEG built for {self.num_levels} levels got {len(spatial_shapes)} spatial shapes")
        pegs = self.pegs[f"layer{layer}"]
        b, n, c = tokens.shape
        outs = []
        start = 0
        for level, (h, w) in enumerate(spatial_shapes):
            end = start + h * w
            grid = tokens[:, start:end].transpose(1, 2).reshape(b, c, h, w)
            level_mask = None if mask is None else mask[:, start:end].reshape(b, h, w)
            outs.append(pegs[f"level{level}"](grid, level_mask).flatten(2).transpose(1, 2))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


@register_encoding("peg", options=PEGOptions)
def build_peg(cfg: PEGOptions, *, dim: int, num_levels: int, num_layers: int) -> PEGEncoding:
    if not cfg.peg_layers:
        raise ConfigError("model.position.peg_layers is empty; list at least one encoder layer (for example [0]).")
    bad = [i for i in cfg.peg_layers if not -1 <= i < num_layers]
    if bad:
        raise ConfigError(
            f"model.position.peg_layers {cfg.peg_layers} has {bad} outside -1..{num_layers - 1} "
            f"(the encoder has {num_layers} layers; -1 means before the first)."
        )
    return PEGEncoding(dim, num_levels=num_levels, layers=cfg.peg_layers, kernel_size=cfg.peg_kernel)
