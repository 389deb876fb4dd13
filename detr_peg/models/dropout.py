"""Dropout whose CPU mask costs less than half of ``torch.nn.Dropout``'s.

On the CPU, ``nn.Dropout`` draws one Bernoulli sample per element (the
largest single cost of a Deformable-DETR-R50 training step after the matrix
products: the feed-forward hidden map alone is ``[B, S, 1024]``). :class:`Dropout`
draws 64 random bits per four elements from the same generator
(``torch.randint`` over the whole int64 range) and compares each 16-bit part
with a threshold, keeps the mask as booleans for the backward pass, and scales
the kept values so that their expectation is unchanged.

What differs from ``nn.Dropout``: the masks are other random draws (neither
implementation can be matched draw for draw across libraries anyway), and the
drop probability is rounded to a multiple of ``1 / 65536`` (``p = 0.1`` drops
with probability ``6554 / 65536 = 0.1000061``), with the scale ``1 / (1 - p')``
of that rounded ``p'``. In evaluation mode, with ``p = 0``, on other devices
than the CPU (CUDA's fused kernel is already fast), with ``inplace=True`` and
under ``torch.compile`` it is ``nn.Dropout`` itself. State-dict keys and ``repr`` are those of
``nn.Dropout``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Resolution of the drop probability: a mask element is dropped when a uniform 16-bit draw is below ``p * LEVELS``.
LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, generator: torch.Generator | None = None) -> tuple[Tensor, float]:
    """A random boolean mask of ``shape`` (True: keep) and the scale of the kept values.

    Args:
        shape: the mask's shape.
        p: drop probability, rounded to a multiple of ``1 / 65536``; the
            rounded value must lie in ``[0, 1)``.
        generator: the random generator (default: torch's global CPU generator).

    Returns:
        ``(keep, scale)``: ``keep`` is ``bool[shape]`` with each element False
        with probability ``p'`` (``p`` rounded), independently; ``scale`` is
        ``1 / (1 - p')``.
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
    """Whether dropout of ``x`` draws the cheaper CPU mask of :func:`cpu_dropout`.

    That is a CPU tensor in training mode, not in place, with ``p`` not rounding
    to 0 or 1, outside ``torch.compile`` (which generates its own random masks
    and cannot trace a draw whose size is symbolic); everything else is
    ``F.dropout`` itself.
    """
    return (
        training
        and not inplace
        and x.device.type == "cpu"
        and round(p * LEVELS) not in (0, LEVELS)
        and not torch.compiler.is_compiling()
    )


def dropout(x: Tensor, p: float, training: bool = True, inplace: bool = False) -> Tensor:
    """``F.dropout`` with the cheaper CPU mask of :func:`cpu_dropout` where :func:`cpu_mask_applies`.

    Args:
        x: ``Tensor[*]``, any float dtype.
        p: drop probability in ``[0, 1)``.
        training: apply dropout (else ``x`` is returned as it is).
        inplace: as ``F.dropout`` (then always ``F.dropout``).

    Returns:
        ``Tensor[*]``, the shape of ``x``.
    """
    if cpu_mask_applies(x, p, training, inplace):
        return cpu_dropout(x, p)
    return F.dropout(x, p, training, inplace)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the cheaper CPU mask of :func:`cpu_dropout` in training mode.

    Args:
        p: drop probability in ``[0, 1)`` (rounded to a multiple of ``1 / 65536``
            on the CPU).
        inplace: as ``nn.Dropout`` (then always ``nn.Dropout``'s own path).

    Shapes: any ``Tensor[*]`` in, the same shape out.
    """

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.inplace)
