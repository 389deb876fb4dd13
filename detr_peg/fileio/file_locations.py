"""Whether a file spec is a URL, and the torch-free check of a local checkpoint path (refused before torch loads)."""

from __future__ import annotations

import os

from detr_peg.errors import CheckpointError
from detr_peg.fileio.bounded_read import check_regular_file


def is_url(spec: str) -> bool:
    """True for ``http://`` and ``https://`` locations."""
    return spec.startswith(("http://", "https://"))


def check_checkpoint_file(path: str | os.PathLike, what: str = "checkpoint") -> int:
    """Check that ``path`` is a readable regular file within the checkpoint limit; return its size (CheckpointError)."""
    return check_regular_file(path, f"The {what} file", "checkpoint", CheckpointError)


def check_checkpoint_location(spec: str | os.PathLike, what: str = "checkpoint") -> None:
    """:func:`check_checkpoint_file` for a local path; a URL passes (it is checked once downloaded)."""
    if not is_url(str(spec)):
        check_checkpoint_file(spec, what)
