"""Per-architecture defaults, applied under every config file and override.

The dataclass defaults in :mod:`detr_peg.config.schema` are the official DETR
values. An architecture lists here only the fields where its official
implementation differs, so ``model.arch=deformable_detr`` alone gives the
official Deformable-DETR model, loss and schedule.
"""

from __future__ import annotations

from typing import Any

ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "detr": {},
    "deformable_detr": {
        "model": {
            "num_queries": 300,
            "transformer": {"dim_feedforward": 1024},
        },
        "loss": {"set_cost_class": 2.0, "ce_loss_coef": 2.0},
        "train": {"lr": 2e-4},
    },
}
