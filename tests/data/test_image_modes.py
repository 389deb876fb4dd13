"""Every Pillow pixel mode is either decoded into the colours it holds or refused in one sentence.

The rule is :func:`detr_peg.data.image_input.to_rgb`'s: a mode is converted
where its values say what colour they are, and refused otherwise. Each mode
that Pillow writes to a file is written, read back by
:func:`~detr_peg.data.image_input.load_rgb_image`, and compared with a
conversion computed here from the stored values (palette lookup, the CMYK,
YCbCr and HSV formulas, 16-bit scaling); the modes that exist only in memory
go through :func:`~detr_peg.data.image_input.as_rgb_tensor`. A test over
Pillow's own list of modes and file formats makes sure no writable mode is
left out of the table.
"""

from __future__ import annotations

import colorsys
import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detr_peg.data.image_input import as_rgb_tensor, load_rgb_image
from detr_peg.errors import DataError

W, H = 9, 5
RNG = np.random.default_rng(7)
BYTES4 = RNG.integers(0, 256, size=(H, W, 4), dtype=np.uint8)
WORDS = RNG.integers(0, 65536, size=(H, W)).astype(np.int64)


def _new(mode: str, channels: int) -> Image.Image:
    return Image.frombytes(mode, (W, H), np.ascontiguousarray(BYTES4[:, :, :channels]).tobytes())


def _palette(mode: str) -> Image.Image:
    img = _new(mode, 2 if mode == "PA" else 1)
    img.putpalette(RNG.integers(0, 256, size=768, dtype=np.uint8).tobytes())
    return img


def _grey16(mode: str) -> Image.Image:
    return Image.frombytes(mode, (W, H), WORDS.astype(">u2" if mode == "I;16B" else "<u2").tobytes())


def _int32(values: np.ndarray) -> Image.Image:
    return Image.fromarray(values.astype(np.int32), "I")


# ------------------------------------------------------------------ independent conversions


def _stored(img: Image.Image) -> np.ndarray:
    return np.asarray(img).astype(np.float64)


def _grey(v: np.ndarray) -> np.ndarray:
    return np.repeat(v[:, :, None], 3, axis=2)


def _lookup(img: Image.Image) -> np.ndarray:
    palette = np.frombuffer(bytes(img.getpalette("RGB")), np.uint8).reshape(-1, 3)
    return palette[np.asarray(img)[..., 0] if img.mode == "PA" else np.asarray(img)].astype(np.float64)


def _cmyk(img: Image.Image) -> np.ndarray:
    v = _stored(img) / 255
    return 255 * (1 - v[..., :3]) * (1 - v[..., 3:])


def _ycbcr(img: Image.Image) -> np.ndarray:
    y, cb, cr = (_stored(img)[..., i] for i in range(3))
    rgb = [y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128), y + 1.772 * (cb - 128)]
    return np.stack(rgb, axis=-1).clip(0, 255)


def _hsv(img: Image.Image) -> np.ndarray:
    flat = _stored(img).reshape(-1, 3) / 255
    return 255 * np.array([colorsys.hsv_to_rgb(*p) for p in flat]).reshape(H, W, 3)


def _premultiplied(img: Image.Image) -> np.ndarray:
    v = _stored(img)
    colour, alpha = v[..., :-1], v[..., -1:]
    out = np.where(alpha > 0, np.minimum(255, np.floor(colour * 255 / np.maximum(alpha, 1) + 0.5)), colour)
    return out if out.shape[-1] == 3 else _grey(out[..., 0])


def _sixteen(img: Image.Image) -> np.ndarray:
    return _grey(np.rint(_stored(img) / 257))


Expected = Callable[[Image.Image], np.ndarray]

#: (test id, the image, file format, expected RGB from the stored image, tolerance); ``None``: refused.
FILE_MODES: list[tuple[str, Callable[[], Image.Image], str, Expected | None, float]] = [
    (
        "1",
        lambda: _new("L", 1).point(lambda v: 255 * (v > 127)).convert("1"),
        "PNG",
        lambda i: _grey(_stored(i) * 255),
        0,
    ),
    ("L", lambda: _new("L", 1), "PNG", lambda i: _grey(_stored(i)), 0),
    ("LA", lambda: _new("LA", 2), "PNG", lambda i: _grey(_stored(i)[..., 0]), 0),
    ("P", lambda: _palette("P"), "PNG", _lookup, 0),
    ("PA", lambda: _palette("PA"), "TIFF", _lookup, 0),
    ("RGB", lambda: _new("RGB", 3), "PNG", lambda i: _stored(i), 0),
    ("RGBA", lambda: _new("RGBA", 4), "PNG", lambda i: _stored(i)[..., :3], 0),
    ("CMYK", lambda: _new("CMYK", 4), "TIFF", _cmyk, 1),
    ("CMYK-jpeg", lambda: _new("CMYK", 4), "JPEG", _cmyk, 1),
    ("YCbCr", lambda: _new("YCbCr", 3), "TIFF", _ycbcr, 1),
    ("I;16", lambda: _grey16("I;16"), "PNG", _sixteen, 0),
    ("I;16-tiff", lambda: _grey16("I;16"), "TIFF", _sixteen, 0),
    ("I;16B", lambda: _grey16("I;16B"), "TIFF", _sixteen, 0),
    ("I;16L", lambda: _grey16("I;16L"), "IM", _sixteen, 0),
    ("I-16-bit-ppm", lambda: _grey16("I;16"), "PPM", _sixteen, 0),
    ("I-in-16-bit-range", lambda: _int32(WORDS), "TIFF", _sixteen, 0),
    ("I-negative", lambda: _int32(WORDS - 40000), "TIFF", None, 0),
    ("I-above-16-bit", lambda: _int32(WORDS * 4), "TIFF", None, 0),
    ("F-0.24-to-0.78", lambda: Image.fromarray((0.24 + 0.54 * WORDS / 65535).astype(np.float32)), "TIFF", None, 0),
    ("F-ppm", lambda: Image.fromarray(WORDS.astype(np.float32)), "PPM", None, 0),
    ("F-spider", lambda: _new("L", 1), "SPIDER", None, 0),
    ("LAB", lambda: _new("LAB", 3), "TIFF", None, 0),
]

#: Modes no Pillow format writes: only ever in memory.
MEMORY_MODES: list[tuple[str, Callable[[], Image.Image], Expected | None, float]] = [
    ("HSV", lambda: _new("HSV", 3), _hsv, 1),
    ("RGBX", lambda: _new("RGBX", 4), lambda i: _stored(i)[..., :3], 0),
    ("RGBa", lambda: _new("RGBa", 4), _premultiplied, 1),
    ("La", lambda: _new("La", 2), _premultiplied, 1),
    ("I;16N", lambda: _grey16("I;16N" if np.little_endian else "I;16B"), _sixteen, 0),
    ("F", lambda: Image.fromarray(np.full((H, W), 0.5, np.float32)), None, 0),
    ("LAB", lambda: _new("LAB", 3), None, 0),
    ("I-negative", lambda: _int32(-WORDS), None, 0),
]


@pytest.mark.parametrize("name, make, fmt, expected, tol", FILE_MODES, ids=[m[0] for m in FILE_MODES])
def test_a_file_of_each_mode_is_decoded_to_its_colours_or_refused(
    tmp_path: Path, name: str, make, fmt: str, expected, tol: float
) -> None:
    path = tmp_path / f"image.{fmt.lower()}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        make().save(path, format=fmt)
    with Image.open(path) as stored:
        stored.load()
        mode = stored.mode
        want = expected(stored) if expected is not None else None
    if want is None:
        with pytest.raises(DataError) as info:
            load_rgb_image(path)
        message = str(info.value)
        assert str(path) in message and f"mode {mode!r}" in message and "\n" not in message, message
        return
    got = np.asarray(load_rgb_image(path)).astype(np.float64)
    assert got.shape == (H, W, 3)
    assert np.abs(got - want).max() <= tol, f"{name} ({mode}): largest difference {np.abs(got - want).max()}"


@pytest.mark.parametrize("name, make, expected, tol", MEMORY_MODES, ids=[m[0] for m in MEMORY_MODES])
def test_an_in_memory_image_of_each_mode_is_converted_or_refused(name: str, make, expected, tol: float) -> None:
    img = make()
    if expected is None:
        with pytest.raises(DataError, match=rf"^image 2 has Pillow mode '{img.mode}'"):
            as_rgb_tensor(img, "image 2")
        return
    got = as_rgb_tensor(img, "image 2").permute(1, 2, 0).numpy().astype(np.float64)
    assert np.abs(got - expected(img)).max() <= tol


def test_the_tables_hold_every_mode_that_pillow_writes_to_a_file() -> None:
    """A mode that some Pillow format writes and reads back unchanged must be in ``FILE_MODES``."""
    tested = {m[0].split("-")[0] for m in FILE_MODES} | {m[0].split("-")[0] for m in MEMORY_MODES}
    writable = set()
    for mode in Image.MODES:
        for fmt in sorted(Image.SAVE):
            buffer = io.BytesIO()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    Image.new(mode, (4, 3)).save(buffer, format=fmt)
                    buffer.seek(0)
                    with Image.open(buffer) as back:
                        if back.mode == mode:
                            writable.add(mode)
            except Exception:  # this format does not write this mode
                continue
    assert writable <= {m[0].split("-")[0] for m in FILE_MODES}, writable - tested
    assert set(Image.MODES) <= tested, set(Image.MODES) - tested
