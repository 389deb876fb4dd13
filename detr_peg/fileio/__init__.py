"""File input and output shared by every layer: atomic writes and safe checkpoint reads. Imports nothing else
from detr_peg; names are imported lazily, so writing a config file does not load torch.
"""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "atomic_write": "detr_peg.fileio.atomic",
    "atomic_write_text": "detr_peg.fileio.atomic",
    "atomic_torch_save": "detr_peg.fileio.checkpoint_files",
    "fetch_url": "detr_peg.fileio.checkpoint_files",
    "is_url": "detr_peg.fileio.file_locations",
    "read_checkpoint_file": "detr_peg.fileio.checkpoint_files",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
