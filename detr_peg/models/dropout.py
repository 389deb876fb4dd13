"""Dropout whose CPU training mask is four 16-bit thresholds per 64-bit random draw (one Bernoulli
sample per element is costly). ``p`` is rounded to a multiple of ``1 / 65536`` and the scale is
``1 / (1 - p')``; elsewhere (eval, ``p = 0``, not CPU, ``inplace``, ``torch.compile``) it is torch's own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Resolution of the drop probability: a mask element is dropped when a uniform 16-bit draw is below ``p * LEVELS``.
LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, generator: torch.Generator | None = None) -> tuple[Tensor, float]:
    """A bool keep-mask of ``shape`` (False with probability ``p'`` = ``p`` rounded to 1/65536), scale ``1 / (1 - p')``.

    Raises ValueError unless ``p'`` is in ``[0, 1)``.
    """
    drop_levels = round(p * LEVELS)
    if not 0 <= drop_levels < LEVELS:
        raise ValueError(f"dropout probability {p} rounds to {drop_levels}/{LEVELS}; it must be in [0, 1)")
    numel = math.prod(shape)
    words = (numel + 3) // 4
    bits = torch.randint(-(1 << 63), (1 << 63) - 1, (words,), dtype=torch.int64, generator=generator)
    # Four uniform int16 values per word, in [-32768, 32767]: P(value < t - 32768) = t / 65536.
    keep = bits.view(torch.int16)[:numel].reshape(shape) >= drop_levels - LEVELS // 2
    return keep, LEVELS / (LEVELS - drop_levels)


class _MaskedScale(torch.autograd.Function):
    """``x * keep * scale``, saving only the boolean mask for the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        # torch.where reads the boolean mask as it is (a product with it would first cast it to x's dtype).
        return torch.where(keep, x, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0).mul_(ctx.scale), None, None


def cpu_dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of a CPU tensor ``x`` (any shape, float dtype) with a 16-bit-threshold mask."""
    keep, scale = keep_mask(x.shape, p)
    return _MaskedScale.apply(x, keep, scale)


def cpu_mask_applies(x: Tensor, p: float, training: bool = True, inplace: bool = False) -> bool:
    """Whether :func:`cpu_dropout` applies: CPU, training, not in place, ``p`` not rounding to 0 or 1, not compiling."""
    return (
        training
        and not inplace
        and x.device.type == "cpu"
        and round(p * LEVELS) not in (0, LEVELS)
        and not torch.compiler.is_compiling()
    )


def dropout(x: Tensor, p: float, training: bool = True, inplace: bool = False) -> Tensor:
    """``F.dropout`` with the cheaper CPU mask of :func:`cpu_dropout` where :func:`cpu_mask_applies`."""
    if cpu_mask_applies(x, p, training, inplace):
        return cpu_dropout(x, p)
    return F.dropout(x, p, training, inplace)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same keys and ``repr``) with the cheaper CPU mask of :func:`cpu_dropout` in training."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.inplace)
