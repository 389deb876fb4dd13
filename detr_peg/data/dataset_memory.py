"""What the sizes of an annotation file cost in memory, checked before anything of that size is allocated.

Config values that size a run are bounded by the memory of the machine (see
:mod:`detr_peg.config.ranges`); sizes that come from the data obey the same
rule. Each estimate here is a *lower bound* in bytes of what a size forces a
run to allocate, and a size whose estimate exceeds :func:`machine_memory` is
a :class:`~detr_peg.errors.DataError` naming the annotation file, the field,
the value and the need, raised before the allocation:

* **categories and images** (:func:`check_evaluation_memory`, when the file
  is read): COCO evaluation keeps, per category, precision and score tables
  of ``10 IoU thresholds x 101 recall points x 4 area ranges x 3 detection
  limits`` float64 values, and one entry per category, area range and image;
* **model labels** (:func:`check_num_classes_memory`, when
  ``model.num_classes`` is taken from the data): the number of categories, or
  the largest category id + 1 when ids are not made contiguous
  (``data.contiguous_labels=false``), becomes ``model.num_classes`` and is
  checked with the config's own estimate of that key;
* **annotations of one image** (:func:`check_matching_memory`, when training
  starts): the matcher compares every query of a batch with every box of the
  batch, several ``[B x Q, boxes]`` float32 cost tables.

Config values in these estimates count at most their defaults, so a size is
refused because of itself (as the loader checks each config value alone).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from detr_peg.config.loader import at_most_defaults, memory_need
from detr_peg.config.ranges import FLOAT, Lookup, format_bytes, machine_memory
from detr_peg.config.schema import Config
from detr_peg.errors import DataError

#: pycocotools' evaluation grid: IoU thresholds, recall points, area ranges, detection limits.
IOU_THRESHOLDS, RECALL_POINTS, AREA_RANGES, DETECTION_LIMITS = 10, 101, 4, 3

#: Bytes of one float64 value and of one Python reference.
DOUBLE = POINTER = 8

#: ``[B x Q, boxes]`` tables the matcher holds at once: the L1 cost, the class cost and the GIoU.
COST_TABLES = 3


def evaluation_memory(num_categories: int, num_images: int) -> float:
    """Bytes that COCO evaluation of ``num_categories`` x ``num_images`` allocates at least.

    ``precision`` and ``scores`` (``[T, R, K, A, M]`` float64 each), ``recall``
    (``[T, K, A, M]``) and the per-image results (``K x A x I`` references).
    """
    per_category = DOUBLE * IOU_THRESHOLDS * (2 * RECALL_POINTS + 1) * AREA_RANGES * DETECTION_LIMITS
    return num_categories * per_category + POINTER * num_categories * AREA_RANGES * num_images


def check_evaluation_memory(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Refuse an annotation file whose categories and images are too many to evaluate on this machine.

    Args:
        data: the parsed file, with ``categories`` and ``images`` lists.
        path: the file, for the message.

    Raises:
        DataError: naming ``categories`` (alone, with one image), ``images``
            (alone, with one category) or both, their counts and the need.
    """
    categories, images = len(data["categories"]), len(data["images"])
    available = machine_memory()
    for field, need in (
        (f"'categories' ({categories} entries)", evaluation_memory(categories, 1)),
        (f"'images' ({images} entries)", evaluation_memory(1, images)),
        (
            f"'categories' ({categories} entries) with 'images' ({images} entries)",
            evaluation_memory(categories, images),
        ),
    ):
        if need > available:
            raise DataError(
                f"Annotation file {os.fspath(path)}: {field} needs at least {format_bytes(need)} of memory "
                f"to evaluate, more than this machine has ({format_bytes(available)})."
            )


def num_classes_origin(categories: Sequence[Mapping[str, Any]], contiguous: bool) -> str:
    """The field of an annotation file that ``model.num_classes`` comes from, with its value.

    ``'categories' (3 entries)`` for contiguous labels, else the largest id:
    ``'categories[2].id' = 90 with data.contiguous_labels=false``.
    """
    if contiguous or not categories:
        return f"'categories' ({len(categories)} entries)"
    index = max(range(len(categories)), key=lambda i: categories[i]["id"])
    return f"'categories[{index}].id' = {categories[index]['id']} with data.contiguous_labels=false"


def check_num_classes_memory(cfg: Config, origin: str, path: str | os.PathLike) -> None:
    """Refuse a ``model.num_classes`` taken from the data that this machine cannot hold.

    Args:
        cfg: the config with ``model.num_classes`` set from the data.
        origin: the field it comes from (:func:`num_classes_origin`).
        path: the annotation file.

    Raises:
        DataError: naming the file, the field and value, ``model.num_classes``
            and the need (the config's own estimate, other values at most
            their defaults).
    """
    need, available = memory_need(cfg, "model.num_classes"), machine_memory()
    if need > available:
        raise DataError(
            f"Annotation file {os.fspath(path)}: {origin} makes model.num_classes {cfg.model.num_classes}, "
            f"which needs at least {format_bytes(need)} of memory, more than this machine has "
            f"({format_bytes(available)})."
        )


def matching_memory(get: Lookup, boxes: int) -> float:
    """Bytes of the matcher's cost tables for a batch holding an image of ``boxes`` boxes, at least."""
    return FLOAT * COST_TABLES * get("train.batch_size") * get("model.num_queries") * boxes


def check_matching_memory(cfg: Config, data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Refuse a training set whose most annotated image has more boxes than matching can hold on this machine.

    Args:
        cfg: the run's config (batch size and queries count at most their defaults).
        data: the parsed annotation file; crowd annotations are not matched.
        path: the file, for the message.

    Raises:
        DataError: naming the file, the image id, its number of annotations and the need.
    """
    counts = Counter(ann["image_id"] for ann in data["annotations"] if not ann.get("iscrowd", 0))
    if not counts:
        return
    image_id, boxes = counts.most_common(1)[0]
    need, available = matching_memory(at_most_defaults(cfg), boxes), machine_memory()
    if need > available:
        raise DataError(
            f"Annotation file {os.fspath(path)}: image id {image_id} has {boxes} annotations ('annotations' with "
            f"image_id {image_id}), whose matching to the queries needs at least {format_bytes(need)} of memory, "
            f"more than this machine has ({format_bytes(available)})."
        )
