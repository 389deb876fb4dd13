"""The detr_peg checkpoint format (:mod:`detr_peg.checkpoint.format`).

Safe reading and atomic writing of files live in :mod:`detr_peg.fileio`
(re-exported here); rebuilding a model from a checkpoint is
:func:`detr_peg.load_model` (:mod:`detr_peg.models.loading`), one layer up.
"""

from detr_peg.checkpoint.format import (
    Checkpoint,
    checkpoint_dict,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from detr_peg.fileio.checkpoint_files import atomic_torch_save, read_checkpoint_file

__all__ = [
    "Checkpoint",
    "atomic_torch_save",
    "checkpoint_dict",
    "load_weights",
    "read_checkpoint",
    "read_checkpoint_file",
    "save_checkpoint",
]
