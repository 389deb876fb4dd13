"""Where a file the user names is (a URL or a local path), and the check of a local checkpoint path.

Torch-free, so that the command line refuses a checkpoint path that is not
there before it imports torch and the models (a few seconds): the same
sentence as :func:`~detr_peg.fileio.checkpoint_files.read_checkpoint_file`
gives when it reads the file.
"""

from __future__ import annotations

import os

from detr_peg.errors import CheckpointError
from detr_peg.fileio.bounded_read import check_regular_file


def is_url(spec: str) -> bool:
    """True for ``http://`` and ``https://`` locations."""
    return spec.startswith(("http://", "https://"))


def check_checkpoint_file(path: str | os.PathLike, what: str = "checkpoint") -> int:
    """Make sure the local file ``path`` is a readable regular file within the checkpoint size limit.

    Args:
        path: a local path.
        what: what the file is, in words (``"official checkpoint"``), for the message.

    Returns:
        The file's size in bytes.

    Raises:
        CheckpointError: ``The <what> file <path> does not exist.`` (or is a folder, special file,
            unreadable, too large).
    """
    return check_regular_file(path, f"The {what} file", "checkpoint", CheckpointError)


def check_checkpoint_location(spec: str | os.PathLike, what: str = "checkpoint") -> None:
    """:func:`check_checkpoint_file` for a local path; a URL passes (it is checked once downloaded)."""
    if not is_url(str(spec)):
        check_checkpoint_file(spec, what)
