"""File input and output shared by every layer: atomic writes and safe checkpoint reads.

The bottom layer of the package beside :mod:`detr_peg.errors`: it imports
nothing else from detr_peg, so config, data, checkpoint, models and engine
write and read files the same way.

* :mod:`~detr_peg.fileio.atomic`: ``atomic_write`` / ``atomic_write_text``
  (temporary file, fsync of the file and of its folder, rename; no torch);
* :mod:`~detr_peg.fileio.file_locations`: ``is_url`` and the check of a
  local checkpoint path (no torch, so commands refuse a missing file at once);
* :mod:`~detr_peg.fileio.checkpoint_files`: ``read_checkpoint_file``
  (``torch.load(weights_only=True)`` or safetensors, local path or URL) and
  ``atomic_torch_save``.

Names are imported lazily, so writing a config file does not load torch.
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
