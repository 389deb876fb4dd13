"""Fixtures of the reliability tests: a tiny dataset, an earlier successful run, the command runner.

Every command runs in a case folder laid out like a user's project::

    case/
      data/images/img0.jpg ... img3.jpg    64x48 JPEGs, two categories
      data/annotations.json                train and val annotation file
      out/                                 an earlier run: checkpoint.pth, config.yaml,
                                           metrics.jsonl, metrics.json, detections.json,
                                           predictions/ (predictions.json and PNGs)

with paths relative to the folder, so the config a command resolves is the
same in every case and the earlier run's ``config.yaml`` stays comparable
byte for byte. The earlier run is made once per session; each test copies it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.cli_process import CliResult, CliRunner
from tests.conftest import cli_runner
from tests.engine.tiny_run import RUN, SMALL_IMAGES, TINY_MODEL

DATA = Path("data")
IMAGES = DATA / "images"
ANNOTATIONS = DATA / "annotations.json"
OUT = Path("out")

#: The tiny run of every case: two iterations per epoch (4 images, batch 2), COCO evaluation on the same images.
BASE = [
    *TINY_MODEL,
    *SMALL_IMAGES,
    *RUN,
    "model.backbone.out_stages=[2]",
    "train.batch_size=2",
    f"data.train_images={IMAGES}",
    f"data.train_annotations={ANNOTATIONS}",
    f"data.val_images={IMAGES}",
    f"data.val_annotations={ANNOTATIONS}",
    f"train.output_dir={OUT}",
]

#: The earlier run trained one epoch; a case resumes it for a second one.
FIRST_RUN = ["train", *BASE, "train.epochs=1"]
RESUME = ["train", "--resume", *BASE, "train.epochs=2"]

CATEGORIES = [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}]
WIDTH, HEIGHT = 64, 48


def draw_image(index: int, boxes: list[list[float]], labels: list[int]) -> np.ndarray:
    """A noisy grey picture with one filled rectangle per box (red for category 1, blue for 2)."""
    rng = np.random.default_rng(index)
    pixels = rng.integers(90, 160, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)
    for (x, y, w, h), label in zip(boxes, labels):
        colour = (220, 30, 30) if label == 1 else (30, 30, 220)
        pixels[int(y) : int(y + h), int(x) : int(x + w)] = colour
    return pixels


def write_dataset(root: Path) -> dict[str, Any]:
    """Four JPEGs with one or two boxes each, and their COCO annotation file."""
    images, annotations = [], []
    for index in range(4):
        boxes = [[4.0 + 3 * index, 6.0, 20.0, 14.0]]
        labels = [1 + index % 2]
        if index % 2:
            boxes.append([36.0, 24.0, 18.0, 16.0])
            labels.append(1)
        name = f"img{index}.jpg"
        (root / IMAGES).mkdir(parents=True, exist_ok=True)
        Image.fromarray(draw_image(index, boxes, labels)).save(root / IMAGES / name, quality=92)
        images.append({"id": index + 1, "file_name": name, "width": WIDTH, "height": HEIGHT})
        for box, label in zip(boxes, labels):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": index + 1,
                    "category_id": label,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    data = {"images": images, "annotations": annotations, "categories": CATEGORIES}
    (root / ANNOTATIONS).write_text(json.dumps(data))
    return data


def read_annotations(case: Path) -> dict[str, Any]:
    return json.loads((case / ANNOTATIONS).read_text())


def write_annotations(case: Path, data: Any) -> None:
    (case / ANNOTATIONS).write_text(json.dumps(data))


# ------------------------------------------------------------------ outputs


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_outputs_kept(before: dict[str, bytes], folder: Path) -> None:
    """The files of an earlier run are byte-identical and nothing was added.

    ``metrics.jsonl`` is a log that a resumed run appends to: its earlier
    content must be kept as a prefix.
    """
    after = snapshot(folder)
    assert sorted(after) == sorted(before), f"files added or removed: {sorted(set(after) ^ set(before))}"
    for name, content in before.items():
        if name == "metrics.jsonl":
            assert after[name].startswith(content), f"{name}: earlier records changed"
        else:
            assert after[name] == content, f"{name} changed"


def assert_one_line_error(result: CliResult, *fragments: str, returncode: int = 2) -> str:
    """Non-zero status, exactly one non-empty stderr line naming every fragment, no traceback."""
    lines = result.stderr_lines
    assert result.returncode == returncode, f"status {result.returncode} ({result.mode}):\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, f"{len(lines)} stderr lines:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("detr-peg "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def assert_success(result: CliResult) -> None:
    assert result.returncode == 0, f"status {result.returncode} ({result.mode}):\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


# ------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Single-threaded torch in this process too (small models, a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def cli() -> CliRunner:
    """The command runner (a warm helper process unless ``DETR_PEG_TEST_COLD_CLI=1``), shared with
    :func:`tests.conftest.run_python`: one helper per test process."""
    return cli_runner()


@pytest.fixture(scope="session")
def cold_cli():
    """A runner that always starts ``python -m detr_peg.cli.main`` afresh."""
    runner = CliRunner("cold")
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def template(tmp_path_factory, cli) -> Path:
    """A case folder with the dataset and an earlier successful run (train one epoch, then predict)."""
    root = tmp_path_factory.mktemp("template")
    write_dataset(root)
    assert_success(cli.run(FIRST_RUN, cwd=root))
    assert_success(
        cli.run(["predict", "--checkpoint", OUT / "checkpoint.pth", IMAGES, "--output", OUT / "predictions"], cwd=root)
    )
    names = set(snapshot(root / OUT))
    assert {
        "checkpoint.pth",
        "config.yaml",
        "metrics.jsonl",
        "metrics.json",
        "detections.json",
        "predictions/predictions.json",
    } <= names, names
    return root


@pytest.fixture
def case(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of :func:`template` for one test."""
    folder = tmp_path / "case"
    shutil.copytree(template, folder, symlinks=True)
    return folder


def edit_annotations(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A case preparation that changes the parsed annotation file in place."""

    def prepare(case: Path) -> None:
        data = read_annotations(case)
        change(data)
        write_annotations(case, data)

    return prepare


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
