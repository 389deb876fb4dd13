"""Training and evaluation: plain functions over a model, its criterion and data.

Entry points (imported lazily)::

    from detr_peg.engine import run_training, run_evaluation

    result = run_training(cfg)          # TrainResult: checkpoint, metrics, iterations, ...
    result = run_evaluation(cfg, "runs/peg/checkpoint.pth", "runs/peg/eval")

Building blocks: ``train_one_epoch`` (:mod:`~detr_peg.engine.train_loop`),
``evaluate`` (:mod:`~detr_peg.engine.evaluate`), ``run_inference``
(:mod:`~detr_peg.engine.inference`, the one inference loop), ``build_optimizer``
and ``build_param_groups`` (:mod:`~detr_peg.engine.optimizer`),
``build_lr_scheduler`` (:mod:`~detr_peg.engine.lr_schedule`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_param_groups": "detr_peg.engine.optimizer",
    "build_optimizer": "detr_peg.engine.optimizer",
    "build_lr_scheduler": "detr_peg.engine.lr_schedule",
    "run_inference": "detr_peg.engine.inference",
    "train_one_epoch": "detr_peg.engine.train_loop",
    "evaluate": "detr_peg.engine.evaluate",
    "run_training": "detr_peg.engine.runner",
    "TrainResult": "detr_peg.engine.runner",
    "run_evaluation": "detr_peg.engine.evaluation_run",
    "EvalResult": "detr_peg.engine.evaluation_run",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'detr_peg.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
