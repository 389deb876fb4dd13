"""Decode an image file into 8-bit RGB, or fail with a message naming the file.

Pillow decodes lazily: ``Image.open`` reads only the header, and a JPEG cut
short can still decode with a grey bottom when
``ImageFile.LOAD_TRUNCATED_IMAGES`` is set. A training run should not learn
from such files silently, so the whole image is decoded here with truncated
loading off, and every failure (missing file, not an image, truncated or
corrupt data, an image too large to be safe) becomes a :class:`DataError`.

Pixel modes are normalised to ``RGB`` uint8:

* 16-bit and 32-bit integer grey (``I;16*``, ``I``) are scaled from
  ``0..65535`` to ``0..255`` (Pillow's own conversion would clip at 255);
* grey, palette, CMYK, YCbCr and the like go through Pillow's conversion;
* alpha channels are dropped (the stored colour under transparent pixels
  is kept), palette transparency included.

EXIF orientation is not applied: COCO boxes refer to the stored pixel grid.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile

from detr_peg.errors import DataError
from detr_peg.fileio.bounded_read import check_image_shape, check_regular_file

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert a fully loaded Pillow image of any mode to ``RGB`` uint8."""
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT_MODES:
        # Round-to-nearest rescale of 0..65535 onto 0..255 (65535 / 255 = 257).
        grey = np.asarray(img).astype(np.int64).clip(0, 65535)
        grey8 = ((grey + 128) // 257).astype(np.uint8)
        return Image.fromarray(np.repeat(grey8[:, :, None], 3, axis=2))
    if img.mode == "P" and "transparency" in img.info:
        # Going through RGBA avoids Pillow's warning about byte transparency.
        img = img.convert("RGBA")
    return img.convert("RGB")


def load_rgb_image(path: str | Path) -> Image.Image:
    """Read and fully decode an image file as 8-bit RGB.

    Args:
        path: the image file.

    Returns:
        A loaded ``PIL.Image.Image`` in mode ``RGB``; ``size`` is ``(W, H)`` of
        the stored pixel grid.

    Raises:
        DataError: the file is missing or unreadable, is not an image Pillow can
            decode, is truncated or corrupt, or has more pixels than
            ``PIL.Image.MAX_IMAGE_PIXELS`` (a possible decompression bomb; raise
            that limit in your own code if you trust the file).
    """
    path = Path(path)
    check_regular_file(path, "Image file", "image", DataError)
    truncated_setting = ImageFile.LOAD_TRUNCATED_IMAGES
    try:
        # Pillow only warns between MAX_IMAGE_PIXELS and twice that; both are errors here.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            ImageFile.LOAD_TRUNCATED_IMAGES = False
            with Image.open(path) as img:
                check_image_shape(img.width, img.height, path, DataError)
                img.load()
                rgb = _to_rgb(img)
                # Closing the file destroys the decoded pixels of ``img`` itself.
                return rgb.copy() if rgb is img else rgb
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DataError(
            f"Image file {path} is too large to decode safely ({err}); if you trust it, raise "
            "PIL.Image.MAX_IMAGE_PIXELS before loading the dataset."
        ) from err
    except Image.UnidentifiedImageError as err:
        raise DataError(
            f"Image file {path} is not an image format Pillow can read (an unknown format or a corrupt header)."
        ) from err
    except OSError as err:
        raise DataError(
            f"Image file {path} cannot be decoded ({err}); the file is probably truncated or corrupt."
        ) from err
    except (SyntaxError, ValueError, EOFError, IndexError, TypeError) as err:
        # Pillow's decoders raise these on some malformed headers and chunks.
        raise DataError(
            f"Image file {path} cannot be decoded ({type(err).__name__}: {err}); the file is probably corrupt."
        ) from err
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = truncated_setting
