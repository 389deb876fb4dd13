"""User images (paths, PIL images, NumPy arrays, tensors) to 8-bit RGB; a bad input is a ``DataError`` naming it.

EXIF orientation is not applied: COCO boxes refer to the stored pixel grid.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile
from torch import Tensor

from detr_peg.bounded_read import check_image_shape, check_regular_file
from detr_peg.errors import ConfigError, DataError
from detr_peg.outputs import os_reason

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
    """A fully loaded Pillow image as ``RGB`` uint8 (``img`` itself if already RGB); alpha is dropped.

    16-bit grey and ``I`` within ``0..65535`` are scaled to ``0..255``. Modes without a defined colour (``F``,
    ``LAB``, ``I`` outside that range, any not in :data:`ACCEPTED_MODES`) raise ``DataError`` rather than be guessed.
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
    """Fully decode an image file (truncated loading off) as a loaded ``RGB`` PIL image, ``size`` ``(W, H)``.

    Raises ``DataError`` if missing, unreadable, undecodable, truncated, corrupt, of a mode :func:`to_rgb` refuses,
    or larger than ``PIL.Image.MAX_IMAGE_PIXELS``.
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
                check_image_shape(img.width, img.height, f"Image file {path}", DataError)
                img.load()
                rgb = to_rgb(img, f"Image file {path}")
                # Closing the file destroys the decoded pixels of ``img`` itself.
                return rgb.copy() if rgb is img else rgb
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DataError(
            f"Image file {path} is too large to decode safely ({err}); downscale it, or, from Python and if you "
            "trust it, raise PIL.Image.MAX_IMAGE_PIXELS before loading the images."
        ) from err
    except Image.UnidentifiedImageError as err:
        raise DataError(
            f"Image file {path} is not an image format Pillow can read (an unknown format or a corrupt header)."
        ) from err
    except OSError as err:
        if err.errno is not None:  # the system's (open files, permissions, I/O), not the picture's
            raise DataError(f"Image file {path} cannot be read: {os_reason(err, path)}.") from err
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


#: What :func:`as_rgb_tensor` accepts.
ImageInput = str | os.PathLike | Image.Image | np.ndarray | Tensor

#: Text longer than this is no path (base64 data, say).
MAX_PATH_CHARS = 4096


def is_encoded(image: Any) -> bool:
    """Encoded image data or a stream (a file's bytes, an upload): one input, refused unread."""
    return isinstance(image, (bytes, bytearray, memoryview)) or hasattr(image, "read")


ACCEPTED = (
    "a path to an image file, a PIL image, a NumPy uint8 array of shape (H, W, 3) or (H, W), "
    "or a tensor of shape (3, H, W) (uint8, or float in [0, 1])"
)


def as_rgb_tensor(image: ImageInput, name: str = "image", *, channels: str = "RGB") -> Tensor:
    """One image as an RGB uint8 ``Tensor[3, H, W]`` on the CPU; ``DataError`` naming ``name`` if unusable.

    Accepts a path (:func:`load_rgb_image`), a PIL image (:func:`to_rgb`), a NumPy uint8 ``(H, W, 3)`` or ``(H, W)``
    array, or a ``(3, H, W)`` tensor, uint8 or float in ``[0, 1]``; arrays and tensors are RGB, or BGR with
    ``channels="BGR"`` (as OpenCV reads frames), which refuses files and PIL images: they carry their own order.
    """
    if channels not in ("RGB", "BGR"):
        raise ConfigError(f"channels must be 'RGB' or 'BGR', got {channels!r}.")
    bgr = channels == "BGR"
    if bgr and isinstance(image, (str, os.PathLike, Image.Image)):
        raise DataError(f"{name} is a file or PIL image, whose channel order is known; channels='BGR' is for arrays "
                        "and tensors.")  # fmt: skip
    if isinstance(image, str) and ("://" in image[:16] or len(image) > MAX_PATH_CHARS) and not os.path.lexists(image):
        what = "a URL" if "://" in image[:16] else f"a string of {len(image)} characters, too long for a path"
        raise DataError(f"{name} is {what}; images are read from files: download or decode it first.")
    if isinstance(image, (str, os.PathLike)):
        image = load_rgb_image(image)
    if isinstance(image, Image.Image):
        _check_size(image.height, image.width, name)
        try:
            pixels = np.array(to_rgb(image, name), dtype=np.uint8)
        except (OSError, ValueError) as exc:  # closed, or opened lazily from a file that is truncated or gone
            raise DataError(f"{name} is a PIL image that cannot be decoded ({exc}).") from None
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
    if isinstance(image, np.ndarray):
        return _from_array(image[:, :, ::-1] if bgr and image.ndim == 3 else image, name)
    if isinstance(image, Tensor):
        return _from_tensor(image, name).flip(0) if bgr else _from_tensor(image, name)
    if is_encoded(image):
        raise DataError(f"{name} is a {type(image).__name__}: encoded bytes or a stream, not an image; decode it with "
                        "PIL.Image.open(io.BytesIO(data)), or give a path as a str.")  # fmt: skip
    raise DataError(f"{name} is a {type(image).__name__}; expected {ACCEPTED}.")


def _from_array(array: np.ndarray, name: str) -> Tensor:
    if array.dtype != np.uint8:
        raise DataError(f"{name} is a NumPy array of dtype {array.dtype}; expected uint8 RGB (convert it first).")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise DataError(f"{name} is a NumPy array of shape {array.shape}; expected (H, W, 3) RGB or (H, W) grey.")
    _check_size(array.shape[0], array.shape[1], name)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()  # a copy: read-only arrays are common


def _from_tensor(tensor: Tensor, name: str) -> Tensor:
    if tensor.layout != torch.strided:  # sparse or nested: the checks below have no kernels for them
        raise DataError(f"{name} is a tensor of layout {tensor.layout}; expected a dense one ({ACCEPTED}).")
    if tensor.dim() != 3 or tensor.shape[0] != 3:
        raise DataError(f"{name} is a tensor of shape {tuple(tensor.shape)}; expected (3, H, W) RGB.")
    _check_size(tensor.shape[1], tensor.shape[2], name)
    if tensor.is_meta:
        raise DataError(f"{name} is a tensor on the meta device, which holds no values; expected {ACCEPTED}.")
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.uint8:
        return tensor.contiguous()
    if not tensor.is_floating_point():
        raise DataError(f"{name} is a tensor of dtype {tensor.dtype}; expected uint8, or float in [0, 1].")
    tensor = tensor.float() if tensor.itemsize == 1 else tensor  # float8 has no isfinite or min kernels
    if not bool(torch.isfinite(tensor).all()):
        raise DataError(f"{name} is a float tensor holding NaN or infinite values; expected {ACCEPTED}.")
    if float(tensor.min()) < 0 or float(tensor.max()) > 1:
        raise DataError(f"{name} is a float tensor with values outside [0, 1]; expected {ACCEPTED}.")
    return (tensor.float() * 255).round().to(torch.uint8)


def _check_size(height: Any, width: Any, name: str) -> None:
    if int(height) < 1 or int(width) < 1:
        raise DataError(f"{name} is empty ({int(height)} x {int(width)} pixels).")
    check_image_shape(int(width), int(height), name, DataError)  # the rule of image files
