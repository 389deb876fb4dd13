"""Which image files a list of files and folders names (``detr-peg predict photos/ extra.jpg``).

Torch-free, so the command line refuses an input that is not there before
it imports torch and the models.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from detr_peg.errors import DataError
from detr_peg.fileio.bounded_read import check_regular_file

#: The file name endings a folder is searched for (compared in lower case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


def collect_images(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Image files from files and folders (folders: every image file inside, recursively, sorted).

    A file is taken as given, whatever its ending (its decoder says whether it is an image).

    Raises:
        DataError: an input does not exist or is not a regular file or folder, or a folder holds no image file.
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if os.path.isdir(path):
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise DataError(f"Folder {path} holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
            found.extend(files)
        else:
            # Names a FIFO, a device, a link loop or a missing file precisely.
            check_regular_file(path, "Input", "image", DataError)
            found.append(path)
    return found
