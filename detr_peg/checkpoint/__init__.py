"""The detr_peg checkpoint format (:mod:`detr_peg.checkpoint.format`), with :mod:`detr_peg.fileio`'s safe reads and
atomic writes re-exported; rebuilding a model from a checkpoint is :func:`detr_peg.load_model`.
"""

from detr_peg.checkpoint.files import atomic_torch_save, read_checkpoint_file
from detr_peg.checkpoint.format import (
    Checkpoint,
    checkpoint_dict,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)

__all__ = [
    "Checkpoint",
    "atomic_torch_save",
    "checkpoint_dict",
    "load_weights",
    "read_checkpoint",
    "read_checkpoint_file",
    "save_checkpoint",
]
