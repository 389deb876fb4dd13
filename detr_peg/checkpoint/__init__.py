"""Checkpoint files: safe reading, atomic writing, the detr_peg format, :func:`load_model`."""

from detr_peg.checkpoint.format import (
    Checkpoint,
    checkpoint_dict,
    load_model,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from detr_peg.checkpoint.io import atomic_torch_save, read_checkpoint_file

__all__ = [
    "Checkpoint",
    "atomic_torch_save",
    "checkpoint_dict",
    "load_model",
    "load_weights",
    "read_checkpoint",
    "read_checkpoint_file",
    "save_checkpoint",
]
