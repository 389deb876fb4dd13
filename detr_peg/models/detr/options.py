"""The config fields that only DETR has, and its registration's defaults.

Registered with the architecture in :mod:`detr_peg.models.detr.build`:
``model.transformer.pre_norm`` and ``loss.eos_coef`` are DETR options, and
giving one with ``model.arch=deformable_detr`` is a config error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detr_peg.config.ranges import valid
from detr_peg.config.schema import LossConfig, TransformerConfig


@dataclass
class DetrTransformerConfig(TransformerConfig):
    """``model.transformer`` of DETR.

    Attributes:
        pre_norm: LayerNorm before each block instead of after.
    """

    pre_norm: bool = False


@dataclass
class DetrLossConfig(LossConfig):
    """``loss`` of DETR.

    Attributes:
        eos_coef: relative weight of the "no object" class in the cross-entropy.
    """

    eos_coef: float = field(default=0.1, metadata=valid(0))


OPTIONS: dict[str, type] = {"model.transformer": DetrTransformerConfig, "loss": DetrLossConfig}

#: The dataclass defaults of the shared sections are the official DETR values.
DEFAULTS: dict[str, Any] = {}
