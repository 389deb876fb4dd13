"""A deterministic synthetic COCO dataset of coloured shapes (``train/``, ``val/``, annotations, ``manifest.json``).

Boxes are COCO ``[x, y, w, h]`` in pixels; ``area`` is the shape's pixel count. Object sides follow
``reference_size``, not the canvas, so a larger canvas keeps the training size distribution.
"""

from __future__ import annotations

import colorsys
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from detr_peg.errors import DataError
from detr_peg.outputs import atomic_write_text, make_folder, writing

SHAPES = ("circle", "square", "triangle", "cross")
MANIFEST_NAME = "manifest.json"
#: Bump when the images or annotations a given set of arguments produces change.
GENERATOR_VERSION = 1
_SPLIT_CODES = {"train": 0, "val": 1}
_GAP = 2  # minimum free pixels between two shapes' boxes


@dataclass(frozen=True)
class SyntheticCoco:
    """Paths of a generated dataset: its root, image folders and COCO annotation files."""

    root: Path
    train_images: Path
    train_annotations: Path
    val_images: Path
    val_annotations: Path

    def data_overrides(self) -> dict[str, str]:
        """The ``data.*`` config values that point a run at this dataset."""
        return {
            "train_images": str(self.train_images),
            "train_annotations": str(self.train_annotations),
            "val_images": str(self.val_images),
            "val_annotations": str(self.val_annotations),
        }


def _background(rng: np.random.Generator, size: int, pattern_scale: float = 1.0) -> np.ndarray:
    """A muted textured background, ``uint8[size, size, 3]``; ``pattern_scale`` is ``size / reference_size``."""
    grey = rng.uniform(90, 165)
    base = grey + rng.uniform(-15, 15, size=3)
    kind = rng.integers(3)
    if kind == 0:  # smooth noise: a coarse random grid, upsampled
        cells = max(2, size // 16)
        coarse = rng.uniform(-20, 20, size=(cells, cells)).astype(np.float32)
        texture = np.asarray(Image.fromarray(coarse).resize((size, size), Image.BICUBIC))
        texture = np.clip(texture, -20, 20)
    else:
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
        angle = rng.uniform(0, np.pi)
        t = np.cos(angle) * xx + np.sin(angle) * yy
        if kind == 1:  # linear gradient
            texture = 40 * pattern_scale * (t - t.mean()) / max(float(np.ptp(t)), 1e-6)
        else:  # stripes
            texture = 15 * np.sin(2 * np.pi * (rng.uniform(3, 10) * pattern_scale) * t + rng.uniform(0, 2 * np.pi))
    fine = rng.normal(0, 3, size=(size, size, 1))
    pixels = base[None, None, :] + texture[:, :, None] + fine
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _shape_mask(shape: str, side: int) -> Image.Image:
    """A ``side x side`` mode ``L`` mask (255 = shape) touching all four borders."""
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    last = side - 1
    if shape == "circle":
        draw.ellipse([0, 0, last, last], fill=255)
    elif shape == "square":
        draw.rectangle([0, 0, last, last], fill=255)
    elif shape == "triangle":
        draw.polygon([(last / 2, 0), (last, last), (0, last)], fill=255)
    elif shape == "cross":
        bar = max(2, side // 3)
        lo = (side - bar) // 2
        draw.rectangle([lo, 0, lo + bar - 1, last], fill=255)
        draw.rectangle([0, lo, last, lo + bar - 1], fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}; valid shapes are {SHAPES}")
    return mask


def _colour(rng: np.random.Generator, class_index: int, color_by_class: bool) -> tuple[int, int, int]:
    """A saturated colour: its channels span at least about 160 levels."""
    if color_by_class:
        hue = (class_index / len(SHAPES) + rng.uniform(-0.04, 0.04)) % 1.0
    else:
        hue = rng.uniform(0, 1)
    r, g, b = colorsys.hsv_to_rgb(hue, rng.uniform(0.75, 1.0), rng.uniform(0.85, 1.0))
    return int(round(r * 255)), int(round(g * 255)), int(round(b * 255))


def object_sides(reference_size: int) -> tuple[int, int]:
    """The smallest and largest shape side in pixels for a reference image size (both included)."""
    min_side = max(8, reference_size // 8)
    return min_side, max(min_side, reference_size // 2)


def render_image(
    rng: np.random.Generator,
    *,
    size: int,
    min_objects: int,
    max_objects: int,
    color_by_class: bool,
    reference_size: int | None = None,
) -> tuple[Image.Image, list[dict[str, Any]]]:
    """Draw one ``RGB`` ``size x size`` image, shapes sized for ``reference_size`` (default ``size``).

    Returns ``(image, objects)``: per shape ``category_index`` (into ``SHAPES``), ``bbox`` (COCO
    ``[x, y, w, h]``, int pixels) and ``area`` (pixel count). Shapes never touch (2-pixel gap).
    """
    reference = size if reference_size is None else reference_size
    image = Image.fromarray(_background(rng, size, size / reference))
    min_side, max_side = object_sides(reference)
    wanted = int(rng.integers(min_objects, max_objects + 1))
    objects: list[dict[str, Any]] = []
    for _ in range(wanted):
        for _attempt in range(50):
            side = int(rng.integers(min_side, max_side + 1))
            x = int(rng.integers(0, size - side + 1))
            y = int(rng.integers(0, size - side + 1))
            if all(
                x + side + _GAP <= ox or ox + ow + _GAP <= x or y + side + _GAP <= oy or oy + oh + _GAP <= y
                for ox, oy, ow, oh in (o["bbox"] for o in objects)
            ):
                break
        else:
            continue  # no free place left for this object
        class_index = int(rng.integers(len(SHAPES)))
        mask = _shape_mask(SHAPES[class_index], side)
        image.paste(_colour(rng, class_index, color_by_class), box=(x, y), mask=mask)
        area = int(np.count_nonzero(np.asarray(mask)))
        objects.append({"category_index": class_index, "bbox": [x, y, side, side], "area": area})
    return image, objects


def _write_split(
    split: str, folder: Path, annotation_file: Path, count: int, params: dict[str, Any], progress: bool
) -> None:
    make_folder(folder)
    images, annotations = [], []
    suffix = params["image_format"]
    for index in tqdm(range(count), desc=f"synthetic {split}", disable=not progress, leave=False):
        rng = np.random.default_rng([params["seed"], _SPLIT_CODES[split], index])
        image, objects = render_image(
            rng,
            size=params["image_size"],
            min_objects=params["min_objects"],
            max_objects=params["max_objects"],
            color_by_class=params["color_by_class"],
            reference_size=params["reference_size"],
        )
        file_name = f"{index:06d}.{suffix}"
        with writing(folder / file_name):
            if suffix == "png":
                image.save(folder / file_name, format="PNG", compress_level=1)
            else:
                image.save(folder / file_name, format="JPEG", quality=95)
        image_id = index + 1
        images.append({"id": image_id, "file_name": file_name, "width": image.width, "height": image.height})
        for obj in objects:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": obj["category_index"] + 1,
                    "bbox": obj["bbox"],
                    "area": obj["area"],
                    "iscrowd": 0,
                }
            )
    coco = {
        "info": {"description": f"detr_peg synthetic shapes ({split})", "version": str(GENERATOR_VERSION)},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(SHAPES)],
    }
    atomic_write_text(annotation_file, json.dumps(coco, indent=1) + "\n")


def _check_arguments(
    num_train: int,
    num_val: int,
    image_size: int,
    reference_size: int,
    min_objects: int,
    max_objects: int,
    image_format: str,
) -> None:
    """Raise ``ValueError`` naming the first argument of :func:`generate_synthetic_coco` out of range."""
    if num_train < 0 or num_val < 1:
        raise ValueError(f"need num_train >= 0 and num_val >= 1, got {num_train} and {num_val}")
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32, got {image_size}")
    if not 32 <= reference_size or object_sides(reference_size)[1] > image_size:
        raise ValueError(
            f"reference_size must be >= 32 and its largest object side fit in image_size "
            f"{image_size}, got {reference_size}"
        )
    if not 1 <= min_objects <= max_objects:
        raise ValueError(f"need 1 <= min_objects <= max_objects, got {min_objects} and {max_objects}")
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format must be 'png' or 'jpg', got {image_format!r}")


def _read_json(path: Path) -> object:
    """The JSON content of ``path``, or None when it is missing or unreadable."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def generate_synthetic_coco(
    out_dir: str | Path,
    *,
    num_train: int = 1000,
    num_val: int = 100,
    image_size: int = 128,
    min_objects: int = 1,
    max_objects: int = 4,
    seed: int = 0,
    color_by_class: bool = False,
    image_format: Literal["png", "jpg"] = "png",
    reference_size: int | None = None,
    progress: bool = True,
) -> SyntheticCoco:
    """Write a synthetic shapes dataset in COCO format, or reuse a complete one with the same arguments.

    The arguments fix every byte; ``num_train=0`` writes a validation-only set. ``image_size`` (at least 32) is the
    square canvas side; shape sides run from ``reference_size // 8`` (at least 8) to ``reference_size // 2``
    (default ``image_size``); fewer than ``max_objects`` are drawn when no free place is found. Raises
    ``ValueError`` for an argument out of range, ``DataError`` if ``out_dir`` holds files it did not write.
    """
    reference_size = image_size if reference_size is None else int(reference_size)
    _check_arguments(num_train, num_val, image_size, reference_size, min_objects, max_objects, image_format)
    root = Path(out_dir)
    result = SyntheticCoco(
        root=root,
        train_images=root / "train",
        train_annotations=root / "annotations_train.json",
        val_images=root / "val",
        val_annotations=root / "annotations_val.json",
    )
    params = {
        "generator": "detr_peg.data.synthetic",
        "version": GENERATOR_VERSION,
        "num_train": num_train,
        "num_val": num_val,
        "image_size": image_size,
        "min_objects": min_objects,
        "max_objects": max_objects,
        "seed": seed,
        "color_by_class": bool(color_by_class),
        "image_format": image_format,
        "reference_size": reference_size,
    }
    manifest_path = root / MANIFEST_NAME
    manifest = _read_json(manifest_path)
    ours = isinstance(manifest, dict) and manifest.get("params", {}).get("generator") == params["generator"]
    if ours and manifest.get("complete") and _with_defaults(manifest.get("params")) == params:
        if _is_complete(result, params):
            return result
    _write_dataset(result, params, ours=ours, progress=progress)
    return result


def _write_dataset(result: SyntheticCoco, params: dict, *, ours: bool, progress: bool) -> None:
    """Write both splits and the manifest (incomplete until the end); ``DataError`` if a folder holds foreign files."""
    for folder in (result.train_images, result.val_images):
        if folder.exists() and any(folder.iterdir()):
            if not ours:
                raise DataError(
                    f"Folder {folder} already holds files that the synthetic generator did not write; "
                    "choose an empty or new output folder."
                )
            shutil.rmtree(folder)
    make_folder(result.root)
    manifest_path = result.root / MANIFEST_NAME
    info = {"object_sides": list(object_sides(params["reference_size"]))}
    atomic_write_text(manifest_path, json.dumps({"params": params, **info, "complete": False}, indent=1) + "\n")
    if params["num_train"] > 0:
        _write_split("train", result.train_images, result.train_annotations, params["num_train"], params, progress)
    _write_split("val", result.val_images, result.val_annotations, params["num_val"], params, progress)
    atomic_write_text(manifest_path, json.dumps({"params": params, **info, "complete": True}, indent=1) + "\n")


def _with_defaults(params: Any) -> Any:
    """Manifest parameters with a missing ``reference_size`` filled in as ``image_size`` (same files)."""
    if not isinstance(params, dict) or "image_size" not in params:
        return params
    return {**params, "reference_size": params.get("reference_size", params["image_size"])}


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    """The generator arguments of a complete synthetic dataset in ``root``, or None if it is not one."""
    path = Path(root) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not manifest.get("complete"):
        return None
    params = _with_defaults(manifest.get("params"))
    if not isinstance(params, dict) or params.get("generator") != "detr_peg.data.synthetic":
        return None
    return params


def larger_canvas(
    params: dict[str, Any], scale: float, out_dir: str | Path, *, progress: bool = False
) -> SyntheticCoco:
    """A validation-only set like ``params`` (:func:`read_manifest`) on a canvas ``scale`` (> 0) times larger.

    Object sizes and pattern scale stay in pixels; the object count scales with the area, so the density
    stays the same. A complete equal set in ``out_dir`` is reused.
    """
    if not scale > 0:
        raise ValueError(f"the canvas scale must be positive, got {scale}")
    area = scale * scale
    min_objects = max(1, round(params["min_objects"] * area))
    arguments = {
        "num_train": 0,
        "num_val": params["num_val"],
        "image_size": max(32, round(params["image_size"] * scale)),
        "reference_size": params["reference_size"],
        "min_objects": min_objects,
        "max_objects": max(min_objects, round(params["max_objects"] * area)),
        "seed": params["seed"],
        "color_by_class": params["color_by_class"],
        "image_format": params["image_format"],
        "progress": progress,
    }
    target = Path(out_dir)
    if not (target / MANIFEST_NAME).is_file():
        # Written next to the target and renamed into place, so evaluations running at the same
        # time never see (or delete) each other's half-written set; the sets are identical anyway.
        make_folder(target.parent)
        with writing(target.parent, "write into"):
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        generate_synthetic_coco(staging, **arguments)
        try:
            staging.rename(target)
        except OSError:  # another process was first
            shutil.rmtree(staging, ignore_errors=True)
    return generate_synthetic_coco(target, **arguments)


def _is_complete(result: SyntheticCoco, params: dict[str, Any]) -> bool:
    """Whether the files a manifest describes are all there (counted, not re-checked byte by byte)."""
    for folder, annotation_file, count in (
        (result.train_images, result.train_annotations, params["num_train"]),
        (result.val_images, result.val_annotations, params["num_val"]),
    ):
        if count == 0:
            continue
        if not annotation_file.is_file() or not folder.is_dir():
            return False
        if sum(1 for _ in folder.glob(f"*.{params['image_format']}")) != count:
            return False
    return True
