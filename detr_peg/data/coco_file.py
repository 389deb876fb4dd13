"""Read and validate a COCO annotation file up front, so a bad file fails with a :class:`DataError` naming the
file, field and value rather than deep in pycocotools or as a NaN loss. Structural problems always raise;
per-sample ones (bad ``bbox``/``area``/``iscrowd``/``category_id``, unsafe ``file_name``) may be skipped.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from pycocotools.coco import COCO

from detr_peg.bounded_read import MAX_ASPECT_RATIO, parse_json, read_bounded_bytes
from detr_peg.config.ranges import MAX_CLASSES, is_number, is_whole
from detr_peg.data.yolo_file import is_yolo_file, read_yolo_dataset
from detr_peg.errors import DataError

logger = logging.getLogger(__name__)

#: Problems named one per line under ``data.on_bad_sample=skip``; the rest are counted in one line.
SHOWN_PROBLEMS = 5

OnBadSample = Literal["error", "skip"]


@dataclass(frozen=True)
class SampleProblem:
    """One invalid image or annotation: its message, the image to leave out (``None``: drop only the annotation
    at ``annotation_index``).
    """

    message: str
    image_id: int | None
    annotation_index: int | None = None


@dataclass
class CocoFile:
    """A validated annotation file: ``data`` without the left-out samples, ``coco`` its pycocotools index (crowd
    included), ``problems`` those skipped (empty in ``error`` mode).
    """

    path: Path
    data: dict[str, Any]
    coco: COCO
    problems: list[SampleProblem] = field(default_factory=list)
    left_out: list[int] = field(default_factory=list)  # ids of the images left out for their problems


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def read_json_file(path: Path) -> Any:
    """Parse a JSON file, turning every failure into a :class:`DataError`."""
    raw = read_bounded_bytes(path, "Annotation file", "annotations", DataError)
    return parse_json(raw, path, "Annotation file", "annotations", DataError)


def file_name_problem(file_name: Any, folder: str = "the image folder") -> str | None:
    """Why a file name read from a file is unusable (empty, NUL, absolute, or ``..`` leaving ``folder``), or None.

    Backslashes count as separators. The rule of image ``file_name``s and of a Transformers folder's shards.
    """
    if not isinstance(file_name, str) or not file_name.strip():
        return "which is not a non-empty string"
    if "\x00" in file_name:
        return "which contains a NUL character, which no file name can hold"
    if file_name.startswith(("/", "\\")) or PureWindowsPath(file_name).drive:
        return f"which is absolute, but file names must be relative to {folder}"
    depth = 0
    for part in PurePosixPath(file_name.replace("\\", "/")).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return f"which leaves {folder}, but file names must stay inside it"
        elif part != ".":
            depth += 1
    return None


def bbox_problem(bbox: Any) -> str | None:
    """A phrase naming a COCO ``bbox`` (``[x, y, width, height]`` in pixels) and its fault, or ``None``."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
        length = f" of length {len(bbox)}" if isinstance(bbox, (list, tuple)) else ""
        return f"bbox {bbox!r}{length}, which is not a list of 4 numbers [x, y, width, height]"
    if not all(is_number(v, finite=False) for v in bbox):
        return f"bbox {bbox!r} holding a value that is not a number"
    x, y, w, h = bbox
    if not (math.isfinite(x) and math.isfinite(y)):
        return f"bbox {bbox!r} whose x or y is not finite"
    for name, value in (("width", w), ("height", h)):
        if not math.isfinite(value) or value <= 0:
            return f"bbox {bbox!r} whose {name} is {value!r}, but width and height must be positive finite numbers"
    return None


def _check_list_of_dicts(data: dict, key: str, path: Path) -> list:
    if key not in data:
        raise DataError(
            f"Annotation file {path} has no '{key}' list; a COCO file needs 'images', 'annotations' and 'categories'."
        )
    entries = data[key]
    if not isinstance(entries, list):
        raise DataError(f"Annotation file {path} has '{key}' of type {_type_name(entries)}; it must be a list.")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DataError(
                f"Annotation file {path} has {key}[{index}] of type {_type_name(entry)}; entries must be objects."
            )
        if not is_whole(entry.get("id")):
            raise DataError(
                f"Annotation file {path} has {key}[{index}] with 'id' {entry.get('id')!r}; "
                "every entry needs an integer id."
            )
    return entries


def _check_unique_ids(entries: list, key: str, path: Path) -> None:
    seen: set[int] = set()
    for index, entry in enumerate(entries):
        if entry["id"] in seen:
            raise DataError(
                f"Annotation file {path} has duplicate {key} id {entry['id']} (again at {key}[{index}]); "
                "ids must be unique."
            )
        seen.add(entry["id"])


def check_structure(data: Any, path: Path) -> None:
    """Raise :class:`DataError` for problems that make the whole file unusable."""
    if not isinstance(data, dict):
        raise DataError(
            f"Annotation file {path} holds a JSON {_type_name(data)} at the top level; a COCO file is an object "
            "with 'images', 'annotations' and 'categories'."
        )
    images = _check_list_of_dicts(data, "images", path)
    annotations = _check_list_of_dicts(data, "annotations", path)
    categories = _check_list_of_dicts(data, "categories", path)
    for key, entries in (("images", images), ("annotations", annotations), ("categories", categories)):
        _check_unique_ids(entries, key, path)
    if not images:
        raise DataError(f"Annotation file {path} has an empty 'images' list; the dataset has no images.")
    if not categories:
        raise DataError(f"Annotation file {path} has an empty 'categories' list; at least one category is needed.")
    for index, cat in enumerate(categories):
        if cat["id"] < 0:
            raise DataError(
                f"Annotation file {path} has category id {cat['id']} (categories[{index}]); ids must be non-negative."
            )
        if not isinstance(cat.get("name"), str):
            raise DataError(
                f"Annotation file {path} has category id {cat['id']} with 'name' {cat.get('name')!r}; "
                "names must be strings."
            )
    counts = Counter(cat["name"] for cat in categories)
    if unclear := sorted(name for name, n in counts.items() if n > 1 or not name.strip()):
        logger.warning("%s: category names %s are empty or shared by several ids; the outputs tell those categories "
                       "apart only by category_id.", path, ", ".join(map(repr, unclear)))  # fmt: skip
    if any("neg_category_ids" in img or "not_exhaustive_category_ids" in img for img in images):
        logger.warning("%s is an LVIS file: detr_peg reads it as COCO, so objects of the categories not checked in an "
                       "image are trained as background and its detections count as false positives; the AP is "
                       "COCO's, not LVIS's (the lvis package computes that).", path)  # fmt: skip
    first_of: dict[Any, int] = {}
    for img in images:
        name = img.get("file_name")
        key = os.path.normpath(name) if isinstance(name, str) and name else None  # ./a.png is a.png
        if key is not None and first_of.setdefault(key, img["id"]) != img["id"]:
            raise DataError(
                f"Annotation file {path} lists file_name {name!r} twice (image ids {first_of[key]} and "
                f"{img['id']}); one picture must be one image record, with all its annotations."
            )
    for index, img in enumerate(images):
        for key in ("width", "height"):
            if key in img and not (is_number(img[key]) and img[key] > 0):
                raise DataError(
                    f"Annotation file {path} has image id {img['id']} (images[{index}]) with '{key}' {img[key]!r}; "
                    "it must be a positive number."
                )


class _FolderIndex:
    """Whether a relative name is in ``root``: one listing per folder, a stat only for names not listed."""

    def __init__(self, root: Path):
        self.root = root
        self._names: dict[str, set[str]] = {}
        self._folded: dict[str, dict[str, str]] = {}

    def __contains__(self, file_name: str) -> bool:
        parent, name = os.path.split(file_name)
        if parent not in self._names:
            try:
                with os.scandir(self.root / parent) as entries:
                    self._names[parent] = {entry.name for entry in entries}
            except OSError:
                self._names[parent] = set()
        return name in self._names[parent] or os.path.lexists(self.root / file_name)  # case-insensitive systems

    def hint(self, file_name: str) -> str:
        """For a name not in the folder: a listed name that differs from it only in Unicode form or case, or ""."""
        parent, name = os.path.split(file_name)
        fold = lambda text: unicodedata.normalize("NFC", text).casefold()  # noqa: E731
        if parent not in self._folded:
            self._folded[parent] = {fold(listed): listed for listed in self._names.get(parent, ())}
        near = self._folded[parent].get(fold(name))
        return f" (it holds {near!r}, the same name in another Unicode form or case)" if near else ""


def find_sample_problems(data: dict, path: Path, images_dir: Path | None = None) -> list[SampleProblem]:
    """Per-image and per-annotation problems of a structurally valid file; with ``images_dir``, missing images too."""
    problems: list[SampleProblem] = []
    present, absent = None if images_dir is None else _FolderIndex(images_dir), 0
    for img in data["images"]:
        reason = file_name_problem(img.get("file_name"))
        w, h = img.get("width"), img.get("height")  # positive numbers when present (check_structure)
        if reason is None and w and h and max(w, h) / min(w, h) > MAX_ASPECT_RATIO:  # as decoding would refuse it
            reason = (
                f"which is {w} x {h} pixels, an aspect ratio above {MAX_ASPECT_RATIO:g}:1 that resizing cannot keep"
            )
        if reason is None and present is not None and img["file_name"] not in present:
            reason = f"which is not in the image folder {images_dir}{present.hint(img['file_name'])}"
            absent += 1
        if reason is not None:
            problems.append(
                SampleProblem(
                    f"Annotation file {path} has image id {img['id']} with file_name "
                    f"{img.get('file_name')!r}, {reason}.",
                    image_id=img["id"],
                )
            )
    if present is not None and absent == len(data["images"]) > 1:  # the wrong folder rather than missing files
        first = data["images"][0]["file_name"]
        raise DataError(f"None of the {absent} images of annotation file {path} is in the image folder {images_dir} "
                        f"(the first: {first!r}{present.hint(first)}); is it the folder of these images?")  # fmt: skip
    image_ids = {img["id"] for img in data["images"]}
    category_ids = {cat["id"] for cat in data["categories"]}
    for index, ann in enumerate(data["annotations"]):
        where = (ann.get("source") or f"Annotation file {path} has annotation id {ann['id']}") + " with"
        image_id = ann.get("image_id")
        if not is_whole(image_id) or image_id not in image_ids:
            problems.append(
                SampleProblem(
                    f"{where} image_id {image_id!r}, which is not the id of an image in the file.",
                    image_id=None,
                    annotation_index=index,
                )
            )
            continue
        reason = None
        category_id = ann.get("category_id")
        if not is_whole(category_id) or category_id not in category_ids:
            reason = f"category_id {category_id!r}, which is not the id of a category in the file"
        elif "iscrowd" in ann and ann["iscrowd"] not in (0, 1):
            reason = f"iscrowd {ann['iscrowd']!r}, but it must be 0 or 1"
        elif "area" in ann and not (is_number(ann["area"]) and ann["area"] >= 0):
            reason = f"area {ann['area']!r}, but it must be a non-negative finite number"
        else:
            reason = ann.get("problem") or bbox_problem(ann.get("bbox"))  # a reader's own (a YOLO line's range)
        if reason is not None:
            problems.append(SampleProblem(f"{where} {reason}.", image_id=image_id, annotation_index=index))
    return problems


def _without_problems(data: dict, problems: list[SampleProblem]) -> dict:
    bad_images = {p.image_id for p in problems if p.image_id is not None}
    bad_annotations = {p.annotation_index for p in problems if p.image_id is None}
    out = dict(data)
    out["images"] = [img for img in data["images"] if img["id"] not in bad_images]
    out["annotations"] = [
        ann
        for index, ann in enumerate(data["annotations"])
        if index not in bad_annotations and ann["image_id"] not in bad_images
    ]
    return out


def _normalise_for_pycocotools(data: dict, path: Path) -> None:
    """Fill a missing ``area`` (box w x h) and ``iscrowd`` (0) in place, and renumber annotation ids 1..N if any is 0.

    ``COCOeval`` reads a matched ground-truth id of 0 as "unmatched", so a 0 id would score its object as missed.
    """
    annotations = data["annotations"]
    no_area = [ann for ann in annotations if "area" not in ann]
    no_crowd = [ann for ann in annotations if "iscrowd" not in ann]
    for ann in no_area:
        ann["area"] = float(ann["bbox"][2]) * float(ann["bbox"][3])
    for ann in no_crowd:
        ann["iscrowd"] = 0
    if no_area:
        logger.info("%s: %d annotations have no 'area'; using box width x height.", path, len(no_area))
    if no_crowd:
        logger.info("%s: %d annotations have no 'iscrowd'; using 0 (not a crowd).", path, len(no_crowd))
    if any(ann["id"] == 0 for ann in annotations):
        for number, ann in enumerate(annotations, start=1):
            ann["id"] = number
        logger.info("%s: annotation ids include 0, which COCO evaluation reads as 'no match'; renumbered 1..%d.",
                    path, len(annotations))  # fmt: skip


def build_coco_index(data: dict) -> COCO:
    """A pycocotools ``COCO`` over an already parsed dict, without its stdout chatter."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def read_coco_file(
    path: str | Path, *, on_bad_sample: OnBadSample = "error", images_dir: str | Path | None = None
) -> CocoFile:
    """Read, validate and index a COCO annotation file, or a YOLO ``data.yaml`` with the images of ``images_dir``.

    ``skip`` logs each per-sample problem and leaves the affected images out. Raises ``DataError`` for a structural
    problem, a per-sample problem in ``error`` mode, or no image left after skipping.
    """
    if on_bad_sample not in ("error", "skip"):
        raise ValueError(f"on_bad_sample must be 'error' or 'skip', got {on_bad_sample!r}")
    path = Path(path)
    data = read_yolo_dataset(path, images_dir) if is_yolo_file(path) else read_json_file(path)
    check_structure(data, path)
    if len(data["categories"]) > MAX_CLASSES:
        raise DataError(
            f"Annotation file {path}: 'categories' has {len(data['categories'])} entries, more than the "
            f"{MAX_CLASSES} a model may have."
        )
    problems = find_sample_problems(data, path, None if images_dir is None else Path(images_dir))
    if problems and on_bad_sample == "error":
        more = f" ({len(problems) - 1} more problems in this file)" if len(problems) > 1 else ""
        raise DataError(
            problems[0].message[:-1] + more + "; fix the file or set data.on_bad_sample=skip to leave such images out."
        )
    if problems:
        for problem in problems[:SHOWN_PROBLEMS]:
            logger.warning("Skipping: %s", problem.message)
        listed = {img["id"] for img in data["images"]}
        data = _without_problems(data, problems)
        left_out = sorted(listed - {img["id"] for img in data["images"]})
        if len(problems) > SHOWN_PROBLEMS:  # a summary, not a line per problem
            logger.warning("Skipping: %d more problems in %s; %d of its %d images are left out in all.",
                           len(problems) - SHOWN_PROBLEMS, path, len(left_out), len(listed))  # fmt: skip
        if not data["images"]:
            raise DataError(f"Annotation file {path} has no valid image left after skipping {len(problems)} problems.")
    _normalise_for_pycocotools(data, path)
    return CocoFile(path, data, build_coco_index(data), problems, left_out if problems else [])
