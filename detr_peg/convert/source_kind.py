"""Which converter reads a ``detr-peg convert`` source, decided from its name alone (torch-free).

A folder, or a Hugging Face Hub name (``owner/name``) that is not a local
path, is a Transformers checkpoint; anything else is an official DETR or
Deformable-DETR checkpoint file or URL, which :func:`check_source` checks
before the command imports torch.
"""

from __future__ import annotations

import os

from detr_peg.fileio.file_locations import check_checkpoint_location
from detr_peg.fileio.hub_files import is_hub_name

#: How messages name an official checkpoint file.
OFFICIAL_FILE = "official checkpoint"


def is_transformers_source(src: str | os.PathLike) -> bool:
    """Whether ``src`` is read as a Transformers checkpoint: a local folder, or a Hub name."""
    return os.path.isdir(src) or is_hub_name(str(src))


def check_source(src: str | os.PathLike) -> None:
    """Refuse an official checkpoint path that is not a readable file (a folder or Hub name is checked when read).

    Raises:
        CheckpointError: ``The official checkpoint file <src> does not exist.`` and the like.
    """
    if not is_transformers_source(src):
        check_checkpoint_location(src, OFFICIAL_FILE)
