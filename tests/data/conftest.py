"""Helpers for the data tests: small COCO-format datasets written into ``tmp_path``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

# Two images (one in a subfolder), two categories with non-contiguous ids, three
# annotations of which one is a crowd region.
BASE_COCO: dict[str, Any] = {
    "images": [
        {"id": 1, "file_name": "a.png", "width": 40, "height": 30},
        {"id": 2, "file_name": "sub/b.png", "width": 20, "height": 24},
    ],
    "annotations": [
        {"id": 10, "image_id": 1, "category_id": 3, "bbox": [1.0, 2.0, 10.0, 20.0], "area": 200.0, "iscrowd": 0},
        {"id": 11, "image_id": 1, "category_id": 7, "bbox": [20.0, 5.0, 30.0, 10.0], "area": 300.0, "iscrowd": 0},
        {"id": 12, "image_id": 2, "category_id": 7, "bbox": [0.0, 0.0, 5.0, 5.0], "area": 25.0, "iscrowd": 1},
    ],
    "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run data tests single-threaded, as data-loader workers do.

    Small tensor ops gain nothing from more threads, and on a busy machine
    oversubscribed threads make them many times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def base_coco() -> dict[str, Any]:
    """A deep copy of :data:`BASE_COCO` to modify."""
    return copy.deepcopy(BASE_COCO)


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def write_images(images_dir: Path, data: dict[str, Any], seed: int = 0) -> None:
    """Write a random RGB PNG of the listed size for every image entry."""
    rng = np.random.default_rng(seed)
    for img in data["images"]:
        path = images_dir / img["file_name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(img["height"], img["width"], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)


def assert_one_sentence(message: str, *fragments: str) -> None:
    """A user-facing message: one line, one sentence, holding every fragment."""
    assert "\n" not in message, message
    assert message.endswith("."), message
    assert ". " not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.fixture
def coco_tmp(tmp_path: Path):
    """Write a dataset (``base_coco()`` or a given dict) into ``tmp_path``; returns (images_dir, ann_file)."""

    def make(data: dict[str, Any] | None = None) -> tuple[Path, Path]:
        data = base_coco() if data is None else data
        images_dir = tmp_path / "images"
        images_dir.mkdir(exist_ok=True)
        write_images(images_dir, data)
        return images_dir, write_json(tmp_path / "annotations.json", data)

    return make
