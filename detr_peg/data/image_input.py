"""Images as users hand them over: file paths, PIL images, NumPy arrays and tensors.

:func:`as_rgb_tensor` turns one input into the 8-bit RGB ``Tensor[3, H, W]``
that the evaluation transform resizes and normalises (folders are expanded
into image files by :func:`~detr_peg.data.image_paths.collect_images`). Anything
else is a :class:`~detr_peg.errors.DataError` (a ``TypeError`` or
``ValueError`` for Python callers would be a bug report; one sentence naming
the input and what is accepted is not).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from detr_peg.data.image_file import load_rgb_image, to_rgb
from detr_peg.errors import DataError

#: What :func:`as_rgb_tensor` accepts.
ImageInput = str | os.PathLike | Image.Image | np.ndarray | Tensor

ACCEPTED = (
    "a path to an image file, a PIL image, a NumPy uint8 array of shape (H, W, 3) or (H, W), "
    "or a tensor of shape (3, H, W) (uint8, or float in [0, 1])"
)


def as_rgb_tensor(image: ImageInput, name: str = "image") -> Tensor:
    """One image as an RGB ``Tensor[3, H, W]`` uint8 on the CPU.

    Args:
        image: a path (decoded by :func:`~detr_peg.data.image_file.load_rgb_image`),
            a PIL image (converted to RGB by :func:`~detr_peg.data.image_file.to_rgb`,
            which refuses modes without a defined conversion), a NumPy ``uint8`` array
            ``(H, W, 3)`` RGB or ``(H, W)`` grey, or a tensor ``(3, H, W)``:
            ``uint8``, or floating point with values in ``[0, 1]``.
        name: how messages refer to the input (``image 3``).

    Raises:
        DataError: an unreadable file or an input of another kind, shape,
            dtype or value range, naming ``name`` and what is accepted.
    """
    if isinstance(image, (str, os.PathLike)):
        image = load_rgb_image(image)
    if isinstance(image, Image.Image):
        rgb = to_rgb(image, name)
        return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous()
    if isinstance(image, np.ndarray):
        return _from_array(image, name)
    if isinstance(image, Tensor):
        return _from_tensor(image, name)
    raise DataError(f"{name} is a {type(image).__name__}; expected {ACCEPTED}.")


def _from_array(array: np.ndarray, name: str) -> Tensor:
    if array.dtype != np.uint8:
        raise DataError(f"{name} is a NumPy array of dtype {array.dtype}; expected uint8 RGB (convert it first).")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise DataError(f"{name} is a NumPy array of shape {array.shape}; expected (H, W, 3) RGB or (H, W) grey.")
    _check_size(array.shape[0], array.shape[1], name)
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1).contiguous()


def _from_tensor(tensor: Tensor, name: str) -> Tensor:
    if tensor.dim() != 3 or tensor.shape[0] != 3:
        raise DataError(f"{name} is a tensor of shape {tuple(tensor.shape)}; expected (3, H, W) RGB.")
    _check_size(tensor.shape[1], tensor.shape[2], name)
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.uint8:
        return tensor.contiguous()
    if not tensor.is_floating_point():
        raise DataError(f"{name} is a tensor of dtype {tensor.dtype}; expected uint8, or float in [0, 1].")
    if not bool(torch.isfinite(tensor).all()) or float(tensor.min()) < 0 or float(tensor.max()) > 1:
        raise DataError(f"{name} is a float tensor with values outside [0, 1]; expected {ACCEPTED}.")
    return (tensor.float() * 255).round().to(torch.uint8)


def _check_size(height: Any, width: Any, name: str) -> None:
    if int(height) < 1 or int(width) < 1:
        raise DataError(f"{name} is empty ({int(height)} x {int(width)} pixels).")
