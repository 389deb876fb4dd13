"""Which image files a list of files and folders names; torch-free, so a missing input fails before torch loads."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from detr_peg.bounded_read import check_regular_file
from detr_peg.errors import DataError

#: The file name endings a folder is searched for (compared in lower case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


def is_image_name(name: str) -> bool:
    """Whether a folder's file ``name`` is searched: an image ending, not hidden (macOS's ``._a.jpg`` metadata)."""
    return Path(name).suffix.lower() in IMAGE_SUFFIXES and not name.startswith(".")


def _unreadable(exc: OSError) -> None:
    raise DataError(f"Folder {exc.filename} cannot be read: {exc.strerror}.")


def collect_images(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given (any ending) and every image file under each folder, recursively, sorted; each file once.

    Raises ``DataError`` for an input that is missing or not a regular file or folder, or a folder without images.
    """
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if os.path.isdir(path):
            walk = os.walk(path, onerror=_unreadable)  # an image name that is no image file is refused, not skipped
            files = sorted(Path(top, n) for top, _, names in walk for n in names if is_image_name(n))
            if not files:
                raise DataError(f"Folder {path} holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
            for file in files:
                check_regular_file(file, "Input", "image", DataError)
            found.extend(files)
        else:
            # Names a FIFO, a device, a link loop or a missing file precisely.
            check_regular_file(path, "Input", "image", DataError)
            found.append(path)
    once: dict[str, Path] = {}
    for path in found:  # a file given again, or inside a folder given too, is one image
        once.setdefault(os.path.realpath(path), path)
    return list(once.values())
