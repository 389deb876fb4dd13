"""Decoding images of every common mode to RGB uint8, and failing clearly on bad files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from detr_peg.data.image_input import load_rgb_image
from detr_peg.errors import DataError
from tests.conftest import run_python
from tests.data.conftest import assert_one_sentence


def _noise(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _as_array(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    array = np.asarray(img)
    assert array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3
    return array


def test_rgb_png_is_exact(tmp_path: Path) -> None:
    pixels = _noise()
    Image.fromarray(pixels).save(tmp_path / "a.png")
    np.testing.assert_array_equal(_as_array(load_rgb_image(tmp_path / "a.png")), pixels)


def test_grayscale_png(tmp_path: Path) -> None:
    grey = _noise()[:, :, 0]
    Image.fromarray(grey).save(tmp_path / "g.png")
    out = _as_array(load_rgb_image(tmp_path / "g.png"))
    for channel in range(3):
        np.testing.assert_array_equal(out[:, :, channel], grey)


def test_rgba_png_drops_alpha(tmp_path: Path) -> None:
    rgba = np.concatenate([_noise(), _noise(seed=1)[:, :, :1]], axis=2)
    Image.fromarray(rgba).save(tmp_path / "a.png")
    np.testing.assert_array_equal(_as_array(load_rgb_image(tmp_path / "a.png")), rgba[:, :, :3])


@pytest.mark.parametrize("transparency", [False, True])
def test_palette_png(tmp_path: Path, transparency: bool) -> None:
    palette = _noise(16, 1).reshape(-1)  # 16 colours
    indices = np.random.default_rng(2).integers(0, 16, size=(20, 30), dtype=np.uint8)
    img = Image.frombytes("P", (30, 20), indices.tobytes())
    img.putpalette(palette.tolist())
    kwargs = {"transparency": 0} if transparency else {}
    img.save(tmp_path / "p.png", **kwargs)
    expected = palette.reshape(16, 3)[indices]
    np.testing.assert_array_equal(_as_array(load_rgb_image(tmp_path / "p.png")), expected)


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    levels = np.arange(256, dtype=np.uint16).reshape(16, 16)
    Image.fromarray(levels * 257).save(tmp_path / "g16.png")  # 0, 257, ..., 65535
    with Image.open(tmp_path / "g16.png") as raw:
        assert raw.mode.startswith("I;16")
    out = _as_array(load_rgb_image(tmp_path / "g16.png"))
    for channel in range(3):
        np.testing.assert_array_equal(out[:, :, channel], levels.astype(np.uint8))


def test_sixteen_bit_rounds_to_nearest(tmp_path: Path) -> None:
    values = np.array([[0, 128, 129, 385, 65534, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "g16.png")
    out = _as_array(load_rgb_image(tmp_path / "g16.png"))[:, :, 0]
    np.testing.assert_array_equal(out, [[0, 0, 1, 1, 255, 255]])


def test_cmyk_jpeg_loads(tmp_path: Path) -> None:
    Image.fromarray(_noise()).convert("CMYK").save(tmp_path / "c.jpg")
    assert _as_array(load_rgb_image(tmp_path / "c.jpg")).shape == (48, 64, 3)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_rgb_image(tmp_path / "none.jpg")
    assert_one_sentence(str(info.value), str(tmp_path / "none.jpg"), "does not exist")


def test_text_file_named_jpg(tmp_path: Path) -> None:
    path = tmp_path / "text.jpg"
    path.write_text("this is not an image\n")
    with pytest.raises(DataError) as info:
        load_rgb_image(path)
    assert_one_sentence(str(info.value), str(path), "not an image format")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(DataError) as info:
        load_rgb_image(path)
    assert_one_sentence(str(info.value), str(path))


@pytest.mark.parametrize("allow_truncated_globally", [False, True])
def test_truncated_jpeg(tmp_path: Path, monkeypatch, allow_truncated_globally: bool) -> None:
    buffer = io.BytesIO()
    Image.fromarray(_noise(128, 128)).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    with Image.open(path) as header_only:  # the header alone still parses
        assert header_only.size == (128, 128)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", allow_truncated_globally)
    with pytest.raises(DataError) as info:
        load_rgb_image(path)
    assert_one_sentence(str(info.value), str(path), "truncated")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is allow_truncated_globally


def test_corrupt_png_data(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(_noise()).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    for i in range(200, 400):  # inside the compressed pixel data
        data[i] ^= 0xFF
    path = tmp_path / "bad.png"
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as info:
        load_rgb_image(path)
    assert_one_sentence(str(info.value), str(path))


@pytest.mark.parametrize("side", [40, 100], ids=["warning-zone", "error-zone"])
def test_decompression_bomb(tmp_path: Path, monkeypatch, side: int) -> None:
    # Pillow warns above MAX_IMAGE_PIXELS and raises above twice that; both must be errors.
    path = tmp_path / "big.png"
    Image.fromarray(_noise(side, side)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(DataError) as info:
        load_rgb_image(path)
    assert_one_sentence(str(info.value), str(path), "too large", "MAX_IMAGE_PIXELS")


def test_in_memory_inputs_obey_the_rules_of_files(tmp_path: Path) -> None:
    """A closed or lazily opened truncated PIL image and a meta tensor are one DataError; a read-only array is used
    as it is, with no warning."""
    import warnings

    import torch

    from detr_peg.data.image_input import as_rgb_tensor

    pixels = _noise()
    Image.fromarray(pixels).save(tmp_path / "a.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "a.png").read_bytes()[:-200])
    closed = Image.open(tmp_path / "a.png")
    closed.close()
    for image in (closed, Image.open(tmp_path / "cut.png"), torch.empty(3, 8, 8, device="meta")):
        with pytest.raises(DataError) as info:
            as_rgb_tensor(image, "image 2")
        assert_one_sentence(str(info.value), "image 2")
    read_only = np.asarray(Image.open(tmp_path / "a.png").convert("RGB"))
    assert not read_only.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(as_rgb_tensor(read_only), torch.from_numpy(pixels).permute(2, 0, 1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"])
def test_a_float_tensor_of_any_precision_is_read_as_its_values(dtype: str) -> None:
    """float8 has no isfinite or min kernels: it was a NotImplementedError, not the checks of other floats."""
    import torch

    from detr_peg.data.image_input import as_rgb_tensor

    levels = torch.tensor([0.0, 0.25, 0.5, 1.0])  # exact in every float format
    image = levels[torch.arange(3 * 4 * 5) % 4].reshape(3, 4, 5)
    torch.testing.assert_close(as_rgb_tensor(image.to(getattr(torch, dtype))), (image * 255).round().to(torch.uint8))
    with pytest.raises(DataError, match="^image is a float tensor with values outside"):
        as_rgb_tensor((image * 2).to(getattr(torch, dtype)), "image")


def test_a_folder_of_images_that_cannot_be_listed_is_named(tmp_path: Path, monkeypatch) -> None:
    """Not skipped as if empty (a chmod 000 folder for a user who is not root: simulated, the tests may run as root)."""
    import os

    from detr_peg.data.image_paths import collect_images

    (tmp_path / "sub").mkdir()
    Image.fromarray(_noise()).save(tmp_path / "a.png")
    listing = os.scandir

    def scandir(path):
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DataError, match=rf"^Folder {tmp_path}/sub cannot be read: Permission denied\.$"):
        collect_images([tmp_path])


def test_a_folder_is_searched_for_its_images_not_the_metadata_of_other_systems(tmp_path: Path) -> None:
    """macOS leaves ``._a.jpg`` (AppleDouble) beside ``a.jpg`` and in ``__MACOSX/``; they are not images."""
    from detr_peg.data.image_paths import collect_images

    Image.fromarray(_noise()).save(tmp_path / "a.JPG")
    (tmp_path / "sub").mkdir()
    Image.fromarray(_noise()).save(tmp_path / "sub" / "b.png")
    for junk in ("._a.JPG", ".DS_Store", "Thumbs.db", "desktop.ini", "sub/._b.png"):
        (tmp_path / junk).write_bytes(b"\x00\x05\x16\x07 Mac OS X")
    (tmp_path / "__MACOSX").mkdir()
    (tmp_path / "__MACOSX" / "._a.JPG").write_bytes(b"\x00\x05\x16\x07")
    assert collect_images([tmp_path]) == [tmp_path / "a.JPG", tmp_path / "sub" / "b.png"]


_OUT_OF_FILES = """
import os, resource, sys
from detr_peg.data.image_input import load_rgb_image
from detr_peg.errors import DataError
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    load_rgb_image(sys.argv[1])
except DataError as exc:
    print(exc)
"""


def test_running_out_of_open_files_is_not_blamed_on_the_image(tmp_path: Path) -> None:
    Image.new("RGB", (8, 6), "red").save(tmp_path / "a.png")
    proc = run_python("-c", _OUT_OF_FILES, str(tmp_path / "a.png"))
    assert proc.stdout.strip() == (
        f"Image file {tmp_path / 'a.png'} cannot be read: Too many open files; raise the limit of open files "
        "(ulimit -n) or lower data.num_workers."
    ), proc.stderr[-2000:]
