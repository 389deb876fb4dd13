"""The detr_peg checkpoint format (:mod:`detr_peg.checkpoint.format`) and safe checkpoint reads and atomic writes
(:mod:`detr_peg.checkpoint.files`); rebuilding a model from a checkpoint is :func:`detr_peg.load_model`. Names load
lazily, so checking a checkpoint's path does not import torch.
"""

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "Checkpoint": "detr_peg.checkpoint.format",
    "checkpoint_dict": "detr_peg.checkpoint.format",
    "load_weights": "detr_peg.checkpoint.format",
    "read_checkpoint": "detr_peg.checkpoint.format",
    "save_checkpoint": "detr_peg.checkpoint.format",
    "atomic_torch_save": "detr_peg.checkpoint.files",
    "read_checkpoint_file": "detr_peg.checkpoint.files",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
