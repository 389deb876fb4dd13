"""Decode an image file into 8-bit RGB, or fail with a message naming the file.

Pillow decodes lazily: ``Image.open`` reads only the header, and a JPEG cut
short can still decode with a grey bottom when
``ImageFile.LOAD_TRUNCATED_IMAGES`` is set. A training run should not learn
from such files silently, so the whole image is decoded here with truncated
loading off, and every failure (missing file, not an image, truncated or
corrupt data, an image too large to be safe) becomes a :class:`DataError`.

Pixel modes are normalised to ``RGB`` uint8 by :func:`to_rgb`, the one
conversion of file and in-memory images (:mod:`detr_peg.data.image_input`).
A mode is converted only where its pixel values say what colour they are;
every other mode is refused, because guessing a range would decode the image
into something other than what it holds (a float TIFF of values 0.24..0.78
would become an all-black picture). The decision, mode by mode:

* ``RGB`` is kept; ``1``, ``L``, ``P``, ``RGBX``, ``CMYK``, ``YCbCr`` (JPEG's
  full-range YCbCr) and ``HSV`` go through Pillow's conversion;
* alpha channels are dropped (the stored colour under transparent pixels is
  kept): ``LA``, ``PA``, ``RGBA``, palette transparency, and the
  premultiplied ``La`` and ``RGBa`` (un-premultiplied first);
* 16-bit grey (``I;16``, ``I;16L``, ``I;16B``, ``I;16N``) is scaled from
  ``0..65535`` to ``0..255`` (Pillow's own conversion would clip at 255), and
  so is 32-bit integer grey (``I``, as 16-bit PPM files open) when its values
  lie in ``0..65535``; other ``I`` values have no defined range and are refused;
* floating-point grey (``F``: TIFF, PPM, SPIDER) has no defined range (0..1,
  0..255 and depth or height maps all occur) and is refused; so is ``LAB``,
  which Pillow's conversion turns into wrong colours, and every other mode.

A refusal is a :class:`DataError` naming the file (or the in-memory input)
and the mode.

EXIF orientation is not applied: COCO boxes refer to the stored pixel grid.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile

from detr_peg.errors import DataError
from detr_peg.fileio.bounded_read import check_image_shape, check_regular_file

#: Modes whose values are grey levels of 0..65535, scaled to 0..255.
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")

#: Modes that Pillow's own conversion turns into the RGB colours they hold (alpha dropped).
PILLOW_CONVERTED_MODES = ("1", "L", "P", "RGBX", "CMYK", "YCbCr", "HSV", "LA", "PA", "RGBA", "RGBa")

#: Modes converted to another accepted mode first (Pillow has no direct conversion to RGB).
VIA_MODE = {"La": "LA"}

#: Every mode :func:`to_rgb` accepts (``I`` only with values in 0..65535).
ACCEPTED_MODES = ("RGB", *PILLOW_CONVERTED_MODES, *SIXTEEN_BIT_MODES, "I", *VIA_MODE)

#: What a refused mode holds, for the message.
_MODE_NAMES = {"F": "32-bit floating-point grey", "LAB": "CIE L*a*b* colour", "I": "32-bit integer grey"}


def to_rgb(img: Image.Image, what: str) -> Image.Image:
    """Convert a fully loaded Pillow image to ``RGB`` uint8, or refuse a mode without a defined meaning.

    Args:
        img: the loaded image, of any mode.
        what: how a message names it (``"Image file photo.tif"``, ``"image 3"``).

    Returns:
        An ``RGB`` image (``img`` itself when it is one already).

    Raises:
        DataError: the mode is not one of :data:`ACCEPTED_MODES`, or ``I``
            values lie outside ``0..65535``; one sentence naming ``what`` and the mode.
    """
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in VIA_MODE:
        return to_rgb(img.convert(VIA_MODE[mode]), what)
    if mode in SIXTEEN_BIT_MODES or mode == "I":
        grey = np.asarray(img).astype(np.int64)
        if mode == "I" and grey.size and (grey.min() < 0 or grey.max() > 65535):
            raise DataError(
                f"{what} has Pillow mode 'I' (32-bit integer grey) with values {grey.min()}..{grey.max()}, "
                "outside the 0..65535 of 16-bit grey, so they have no defined brightness; save it as 8-bit or "
                "16-bit grey or RGB."
            )
        # Round-to-nearest rescale of 0..65535 onto 0..255 (65535 / 255 = 257).
        grey8 = ((grey + 128) // 257).astype(np.uint8)
        return Image.fromarray(np.repeat(grey8[:, :, None], 3, axis=2))
    if mode in PILLOW_CONVERTED_MODES:
        if mode == "P" and "transparency" in img.info:
            # Going through RGBA avoids Pillow's warning about byte transparency.
            img = img.convert("RGBA")
        return img.convert("RGB")
    kind = f" ({_MODE_NAMES[mode]})" if mode in _MODE_NAMES else ""
    raise DataError(
        f"{what} has Pillow mode {mode!r}{kind}, which has no defined conversion to 8-bit RGB, so it is "
        "not decoded rather than decoded into other colours; save it as 8-bit or 16-bit grey or RGB."
    )


def load_rgb_image(path: str | Path) -> Image.Image:
    """Read and fully decode an image file as 8-bit RGB.

    Args:
        path: the image file.

    Returns:
        A loaded ``PIL.Image.Image`` in mode ``RGB``; ``size`` is ``(W, H)`` of
        the stored pixel grid.

    Raises:
        DataError: the file is missing or unreadable, is not an image Pillow can
            decode, is truncated or corrupt, has a pixel mode :func:`to_rgb`
            refuses, or has more pixels than
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
                rgb = to_rgb(img, f"Image file {path}")
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
