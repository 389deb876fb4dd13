"""Training and evaluation over a model, its criterion and data.

Entry points (imported lazily): ``run_training(cfg)`` and ``run_evaluation(cfg, checkpoint, output_dir)``.
"""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "Trainer": "detr_peg.engine.trainer",
    "TrainResult": "detr_peg.engine.training",
    "run_training": "detr_peg.engine.training",
    "train_step": "detr_peg.engine.trainer",
    "HookBase": "detr_peg.engine.trainer",
    "build_param_groups": "detr_peg.engine.optimizer",
    "build_optimizer": "detr_peg.engine.optimizer",
    "build_lr_scheduler": "detr_peg.engine.optimizer",
    "run_inference": "detr_peg.engine.inference",
    "evaluate": "detr_peg.engine.evaluation.evaluate",
    "run_evaluation": "detr_peg.engine.evaluation.run",
    "EvalResult": "detr_peg.engine.evaluation.run",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
