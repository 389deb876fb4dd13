"""Which converter reads a ``detr-peg convert`` source, from its name alone (torch-free): folder/Hub name, or file."""

from __future__ import annotations

import os

from detr_peg.checkpoint.files import check_checkpoint_location
from detr_peg.checkpoint.hub_files import is_hub_name

#: How messages name an official checkpoint file.
OFFICIAL_FILE = "official checkpoint"
#: How a source that detr_peg wrote is refused (advice follows).
NO_CONVERSION = "{src} was written by detr_peg and needs no conversion; give "


def is_transformers_source(src: str | os.PathLike) -> bool:
    """Whether ``src`` is read as a Transformers checkpoint: a local folder, or a Hub name."""
    return os.path.isdir(src) or is_hub_name(os.fsdecode(src))


def check_source(src: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` for an official checkpoint path that is not a readable file."""
    if not is_transformers_source(src):
        check_checkpoint_location(src, OFFICIAL_FILE)
