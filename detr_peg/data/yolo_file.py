"""A YOLO-format detection dataset read as a COCO dict, so the COCO file's rules and evaluation apply unchanged.

The layout is Ultralytics': a ``data.yaml`` whose ``names`` (a list, or a mapping from class index) name the
classes; the boxes of ``.../images/<name>.jpg`` are in ``.../labels/<name>.txt``, one ``class cx cy w h`` line per
object, normalised to the image (a polygon line ``class x1 y1 x2 y2 ...`` gives its box). An image without a label
file has no objects. Class ``i`` becomes category id ``i``; each annotation keeps its line as ``source``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from detr_peg.bounded_read import decode_utf8, load_yaml_text, read_bounded_bytes, yaml_problem
from detr_peg.data.image_paths import IMAGE_SUFFIXES, is_image_name
from detr_peg.errors import DataError

YAML_SUFFIXES = (".yaml", ".yml")


def is_yolo_file(path: str | Path) -> bool:
    """Whether an annotation path names a YOLO ``data.yaml`` rather than a COCO JSON file."""
    return Path(path).suffix.lower() in YAML_SUFFIXES


def _read_text(path: Path, what: str) -> str:
    return decode_utf8(read_bounded_bytes(path, what, "annotations", DataError), path, what, DataError)


def read_categories(path: Path) -> list[dict[str, Any]]:
    """COCO categories from ``data.yaml``'s ``names``; ``DataError`` naming the file if there are none."""
    try:
        data = load_yaml_text(_read_text(path, "Dataset file"), path, "Dataset file", "annotations", DataError)
    except yaml.YAMLError as exc:
        raise DataError(f"Dataset file {path}: invalid YAML{yaml_problem(exc)}.") from None
    given = data.get("names") if isinstance(data, dict) else None
    names = dict(enumerate(given)) if isinstance(given, list) else given
    if not isinstance(names, dict) or not names or not all(isinstance(k, int) for k in names):
        raise DataError(
            f"Dataset file {path} has 'names' {given!r}; a YOLO data.yaml names its classes as a list or as a "
            "mapping from class index (0: person)."
        )
    # Digits name classes too (names: [0, 1, 2] of a digit dataset), read as Ultralytics reads them.
    return [
        {"id": i, "name": str(n) if isinstance(n, int) and not isinstance(n, bool) else n}
        for i, n in sorted(names.items())
    ]


def label_path(image: Path) -> Path:
    """Ultralytics' rule: the last ``images`` folder of the path becomes ``labels``, the ending ``.txt``."""
    parts = image.parts
    if "images" not in parts[:-1]:
        raise DataError(
            f"Image {image} is not under a folder named 'images', so its YOLO label file cannot be found "
            "(the boxes of .../images/a.jpg are in .../labels/a.txt)."
        )
    at = len(parts) - 2 - parts[-2::-1].index("images")
    return Path(*parts[:at], "labels", *parts[at + 1 :]).with_suffix(".txt")


def _number(token: str) -> float | str:
    try:
        return float(token)
    except ValueError:
        return token


def _annotation(tokens: list[str], width: int, height: int) -> dict[str, Any]:
    """A COCO annotation (pixel ``[x, y, w, h]`` box) of one label line; faulty values are kept for the checks."""
    category: Any = int(tokens[0]) if tokens[0].isascii() and tokens[0].isdigit() and len(tokens[0]) < 10 else tokens[0]
    values = [_number(t) for t in tokens[1:]]
    if not all(isinstance(v, float) for v in values) or len(values) < 4 or (len(values) != 4 and len(values) % 2):
        return {"category_id": category, "bbox": tokens[1:]}
    if any(math.isfinite(v) and not -1e-3 <= v <= 1 + 1e-3 for v in values):  # pixels, say: no box to make
        problem = f"coordinates {' '.join(tokens[1:])}, but YOLO coordinates are fractions of the image, 0 to 1"
        return {"category_id": category, "bbox": tokens[1:], "problem": problem}
    if len(values) == 4:
        cx, cy, w, h = values
        x, y = cx - w / 2, cy - h / 2
    else:
        x, y = min(values[0::2]), min(values[1::2])
        w, h = max(values[0::2]) - x, max(values[1::2]) - y
    box = [x * width, y * height, w * width, h * height]
    sound = all(math.isfinite(v) for v in box) and min(box[2:]) > 0  # else the bbox check names the fault
    return {"category_id": category, "bbox": box, "iscrowd": 0, **({"area": box[2] * box[3]} if sound else {})}


def read_yolo_dataset(path: str | Path, images_dir: str | Path | None) -> dict[str, Any]:
    """The COCO dict of the images under ``images_dir`` (recursively) and their label files; classes from ``path``.

    An image whose header cannot be read is listed without a size, so loading it fails (or skips) as any bad image.
    """
    if images_dir is None:  # the data.yaml's folder would mix the splits
        raise DataError(f"Dataset file {path} is a YOLO data.yaml; give the image folder of the split it is read for.")
    path, images_dir = Path(path), Path(images_dir)
    data: dict[str, Any] = {"images": [], "annotations": [], "categories": read_categories(path)}
    files = sorted(p for p in images_dir.rglob("*") if p.is_file() and is_image_name(p.name))
    if not files:
        raise DataError(f"Image folder {images_dir} holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
    found: dict[Path, Path] = {}  # label file -> image
    for image_id, image in enumerate(files, start=1):
        record: dict[str, Any] = {"id": image_id, "file_name": image.relative_to(images_dir).as_posix()}
        data["images"].append(record)
        labels = label_path(image)
        if labels in found:
            raise DataError(f"Images {found[labels]} and {image} share the label file {labels}; rename one of them.")
        found[labels] = image
        try:
            with Image.open(image) as img:
                record["width"], record["height"] = img.size
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            continue  # named when the image is loaded
        if not os.path.lexists(labels):  # a dangling link is refused by the read
            continue
        for number, line in enumerate(_read_text(labels, "Label file").lstrip("\ufeff").splitlines(), start=1):
            if line.strip():
                ann = _annotation(line.split(), record["width"], record["height"])
                ann.update(
                    id=len(data["annotations"]) + 1,
                    image_id=image_id,
                    source=f"Label file {labels} has, on line {number}, a box",
                )
                data["annotations"].append(ann)
    if not any(os.path.lexists(labels) for labels in found):
        raise DataError(f"None of the {len(files)} images under {images_dir} has a label file (for {files[0]}: "
                        f"{label_path(files[0])}); a YOLO dataset keeps its boxes in a labels folder.")  # fmt: skip
    return data
