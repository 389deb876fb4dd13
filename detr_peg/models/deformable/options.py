"""Config fields only Deformable-DETR has (official key paths), and its defaults where they differ from DETR;
any of these fields with ``model.arch=detr`` is a config error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from detr_peg.config.ranges import valid
from detr_peg.config.schema import EvalConfig, LossConfig, ModelConfig, TransformerConfig


@dataclass
class DeformableModelConfig(ModelConfig):
    """``model`` of Deformable-DETR; ``two_stage`` needs ``with_box_refine``."""

    with_box_refine: bool = False
    two_stage: bool = False


@dataclass
class DeformableTransformerConfig(TransformerConfig):
    """``model.transformer`` of Deformable-DETR; two-stage, ``two_stage_num_proposals`` replaces ``num_queries``."""

    num_feature_levels: int = field(default=4, metadata=valid(1, 16))
    enc_n_points: int = field(default=4, metadata=valid(1, 256))
    dec_n_points: int = field(default=4, metadata=valid(1, 256))
    two_stage_num_proposals: int = field(default=300, metadata=valid(1, 100_000))


@dataclass
class DeformableLossConfig(LossConfig):
    """``loss`` of Deformable-DETR (focal loss)."""

    focal_alpha: float = field(default=0.25, metadata=valid(0, 1))
    focal_gamma: float = field(default=2.0, metadata=valid(0))


@dataclass
class DeformableEvalConfig(EvalConfig):
    """``eval`` of Deformable-DETR: ``num_select`` detections kept per image (top-k over queries x classes)."""

    num_select: int = field(default=100, metadata=valid(1))


OPTIONS: dict[str, type] = {
    "model": DeformableModelConfig,
    "model.transformer": DeformableTransformerConfig,
    "loss": DeformableLossConfig,
    "eval": DeformableEvalConfig,
}

#: Where the official Deformable-DETR differs from the DETR defaults of the shared sections.
DEFAULTS: dict[str, Any] = {
    "model": {
        "num_queries": 300,
        "transformer": {"dim_feedforward": 1024},
        # The official sine encoding measures positions from pixel centres (a default only under sine).
        "position": {"offset": -0.5},
    },
    "loss": {"set_cost_class": 2.0, "ce_loss_coef": 2.0},
    "train": {"lr": 2e-4},
}
