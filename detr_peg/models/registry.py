"""The model-architecture registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from detr_peg.config.schema import Config
from detr_peg.registry import Registry


@dataclass(frozen=True)
class Architecture:
    """Everything that differs between detector families.

    Attributes:
        build_model: ``Config -> nn.Module`` (the detector).
        build_criterion: ``Config -> SetCriterion``.
        build_postprocessor: ``Config -> nn.Module`` mapping outputs and
            ``target_sizes`` to per-image detections.
        sine_offset: the official sine-encoding offset of this family.
    """

    build_model: Callable[[Config], nn.Module]
    build_criterion: Callable[[Config], nn.Module]
    build_postprocessor: Callable[[Config], nn.Module]
    sine_offset: float = 0.0


MODELS: Registry = Registry(
    "model architecture",
    """Detector families by ``model.arch``; each entry is an :class:`Architecture`.""",
)
