"""Training and evaluation over a model, its criterion and data.

Entry points (imported lazily)::

    from detr_peg.engine import run_training, run_evaluation

    result = run_training(cfg)          # TrainResult: checkpoint, metrics, iterations, ...
    result = run_evaluation(cfg, "runs/peg/checkpoint.pth", "runs/peg/eval")

Files, by job:

* training: :mod:`~detr_peg.engine.training` (``run_training``, a run built from a config),
  :mod:`~detr_peg.engine.trainer` (the :class:`~detr_peg.engine.trainer.Trainer` loop,
  its hook interface and one ``train_step``),
  :mod:`~detr_peg.engine.hooks` (checkpoints, evaluation, the learning-rate
  schedule, stop signals, the iteration budget), :mod:`~detr_peg.engine.checkpointing`,
  :mod:`~detr_peg.engine.optimizer` (AdamW, its parameter groups and its
  schedule), :mod:`~detr_peg.engine.mixed_precision`, :mod:`~detr_peg.engine.loader`,
  :mod:`~detr_peg.engine.metrics_log`;
* evaluation: the :mod:`~detr_peg.engine.evaluation` package;
* inference: :mod:`~detr_peg.engine.inference` (the one inference loop),
  :mod:`~detr_peg.engine.detections` and :mod:`~detr_peg.engine.drawing`;
* processes: :mod:`~detr_peg.engine.distributed` (``process_group``, the one
  set-up every command uses), :mod:`~detr_peg.engine.memory_allocator`.
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
