"""CPVT's Positional Encoding Generator for detection (``peg``): ``x + ReLU(BN(DWConv_kxk(x)))`` on the
token grid. Padded tokens are zeroed before the conv and come out unchanged; training BatchNorm
statistics use valid tokens only (see docs/model.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.config.ranges import valid
from detr_peg.config.schema import PositionConfig
from detr_peg.errors import ConfigError
from detr_peg.models.argument_checks import check_mask
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


@dataclass
class PEGOptions(PositionConfig):
    """``model.position`` options of ``peg``: ``peg_layers`` (0-based, ``-1`` = before layer 0), odd ``peg_kernel``."""

    name: str = "peg"
    peg_layers: list[int] = field(default_factory=lambda: [0], metadata=valid(-1, non_empty=True))
    peg_kernel: int = field(default=3, metadata=valid(1, 255))


def masked_batch_norm(x: Tensor, valid: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """Training batch norm with statistics of valid positions only, ``nn.BatchNorm2d``'s update rule, no host sync.

    ``x`` ``[B, C, H, W]``; ``valid`` ``[B, 1, H, W]`` bool, True = valid. Padded positions of the result
    are garbage the caller discards. Statistics are computed in float32 at least (a float16 count of valid positions
    overflows above 65,504), the result returned in ``x``'s dtype.
    """
    dtype, x = x.dtype, x.to(torch.promote_types(x.dtype, torch.float32))
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
    return out.to(dtype)


class PEG(nn.Module):
    """One PEGDetection block: bias-free depthwise ``k x k`` conv and BatchNorm; ConfigError unless ``k`` is odd."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ConfigError(f"model.position.peg_kernel must be a positive odd number, got {kernel_size}.")
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x`` ``[B, C, H, W]``, ``mask`` ``[B, H, W]`` (True = padding) or None -> ``x`` + PEG, ``x`` at pads."""
        if mask is None:
            return x + F.relu(self.norm(self.proj(x)))
        check_mask(mask, x)
        valid = ~mask.unsqueeze(1)
        zeroed = x * valid
        y = self.proj(zeroed)
        y = masked_batch_norm(y, valid, self.norm) if self.training else self.norm(y)
        return torch.where(valid, zeroed + F.relu(y), x)


class PEGEncoding(PositionalEncoding):
    """One PEG per configured layer and level (keys ``pegs.layer{i}.level{l}.*``, ``layer-1`` = encoder input)."""

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
    twice = sorted({i for i in cfg.peg_layers if cfg.peg_layers.count(i) > 1})
    if twice:
        raise ConfigError(f"model.position.peg_layers {cfg.peg_layers} lists layer {twice[0]} more than once.")
    bad = [i for i in cfg.peg_layers if not -1 <= i < num_layers]
    if bad:
        raise ConfigError(
            f"model.position.peg_layers {cfg.peg_layers} has {bad} outside -1..{num_layers - 1} "
            f"(the encoder has {num_layers} layers; -1 means before the first)."
        )
    return PEGEncoding(dim, num_levels=num_levels, layers=cfg.peg_layers, kernel_size=cfg.peg_kernel)
