"""Images whose pixel mode has no defined conversion to RGB are refused by every command, not decoded into black.

The rule is :func:`detr_peg.data.image_input.to_rgb`'s (see
``tests/data/test_image_modes.py`` for the pixel values of every mode it
accepts): a float TIFF, a CIE L*a*b* TIFF or 32-bit integers outside
``0..65535`` are one line naming the image file and its mode, exit status 2,
and nothing written, whether ``predict`` reads them or training and
evaluation meet them in a dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.reliability.conftest import HEIGHT, IMAGES, OUT, RESUME, WIDTH, edit_annotations
from tests.reliability.hostile_cases import Hostile, check_refused, ids

CKPT = str(OUT / "checkpoint.pth")
EVAL = ["eval", "--checkpoint", CKPT, "--output", OUT]
GRID = np.linspace(0, 1, WIDTH * HEIGHT).reshape(HEIGHT, WIDTH)


def _float_tiff() -> Image.Image:
    """Mode ``F`` with values 0.24..0.78 (Pillow's own conversion makes it all black)."""
    return Image.fromarray((0.24 + 0.54 * GRID).astype(np.float32))


def _lab() -> Image.Image:
    return Image.frombytes("LAB", (WIDTH, HEIGHT), (GRID[:, :, None] * [200, 100, 150]).astype(np.uint8).tobytes())


def _int32(low: int, high: int) -> Image.Image:
    return Image.fromarray((low + (high - low) * GRID).astype(np.int32), "I")


def _image(name: str, make, fmt: str = "TIFF", *, in_dataset: bool = False):
    """Write ``make()`` as ``IMAGES/name``; ``in_dataset``: it replaces image 2 of the annotation file."""

    def prepare(case: Path) -> None:
        make().save(case / IMAGES / name, format=fmt)
        if in_dataset:
            edit_annotations(lambda d: d["images"][1].update(file_name=name))(case)

    return prepare


def _predict(name: str) -> list:
    return ["predict", "--checkpoint", CKPT, IMAGES / name, "--output", "pred"]


CASES = [
    # the example of the rule
    Hostile(
        "predict-float-tiff",
        _predict("f.tif"),
        [str(IMAGES / "f.tif"), "Pillow mode 'F' (32-bit floating-point grey)"],
        _image("f.tif", _float_tiff),
    ),
    Hostile(
        "train-on-a-float-tiff",
        RESUME,
        [str(IMAGES / "f.tif"), "Pillow mode 'F'"],
        _image("f.tif", _float_tiff, in_dataset=True),
    ),
    # more members of the class
    Hostile(
        "evaluate-a-float-tiff",
        EVAL,
        [str(IMAGES / "f.tif"), "Pillow mode 'F'"],
        _image("f.tif", _float_tiff, in_dataset=True),
    ),
    Hostile(
        "predict-float-ppm",
        _predict("f.ppm"),
        [str(IMAGES / "f.ppm"), "Pillow mode 'F'"],
        _image("f.ppm", lambda: Image.fromarray((255 * GRID).astype(np.float32)), "PPM"),
    ),
    Hostile(
        "predict-lab-tiff",
        _predict("lab.tif"),
        [str(IMAGES / "lab.tif"), "Pillow mode 'LAB' (CIE L*a*b* colour)"],
        _image("lab.tif", _lab),
    ),
    Hostile(
        "train-on-a-lab-tiff",
        RESUME,
        [str(IMAGES / "lab.tif"), "Pillow mode 'LAB'"],
        _image("lab.tif", _lab, in_dataset=True),
    ),
    Hostile(
        "predict-int32-beyond-16-bit",
        _predict("i.tif"),
        [str(IMAGES / "i.tif"), "Pillow mode 'I' (32-bit integer grey) with values 0..1000000", "0..65535"],
        _image("i.tif", lambda: _int32(0, 1_000_000)),
    ),
    Hostile(
        "train-on-negative-int32",
        RESUME,
        [str(IMAGES / "i.tif"), "Pillow mode 'I'", "with values -500..", "0..65535"],
        _image("i.tif", lambda: _int32(-500, 300), in_dataset=True),
    ),
]


@pytest.mark.parametrize("spec", CASES, ids=ids(CASES))
def test_an_image_without_a_defined_conversion_is_refused(cli, case: Path, spec: Hostile) -> None:
    check_refused(cli, case, spec)
