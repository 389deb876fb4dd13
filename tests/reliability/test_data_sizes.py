"""Sizes that come from the data are bounded by the memory they need, before anything is allocated.

The rule (:mod:`detr_peg.data.dataset_memory`, the memory rule of config
values applied to the data): the number of categories, the largest category
id when ids are not made contiguous, and the number of images are checked
against the memory of the machine when the annotation file is read or
``model.num_classes`` is taken from it, and a size that does not fit is one
line naming the annotation file, the field, the value and the need. Counts
that depend on the machine are computed from its memory, so each case is
just over the bound wherever it runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detr_peg.config.ranges import machine_memory
from detr_peg.data.dataset_memory import check_evaluation_memory, evaluation_memory
from tests.reliability.conftest import (
    ANNOTATIONS,
    BASE,
    OUT,
    RESUME,
    assert_one_line_error,
    assert_outputs_kept,
    edit_annotations,
    snapshot,
)

ANN = str(ANNOTATIONS)
BIG = "more than this machine has"
EVAL = ["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", OUT]
#: A fresh run (labels made contiguous), and one whose labels are the category ids themselves.
FRESH = ["train", *BASE, f"train.output_dir={OUT / 'raw'}", "train.epochs=1"]
RAW_LABELS = [*FRESH, "data.contiguous_labels=false"]


def _category_id(index: int, new_id: int):
    """Give category ``index`` the id ``new_id`` (and its annotations with it)."""

    def change(data: dict) -> None:
        old = data["categories"][index]["id"]
        data["categories"][index]["id"] = new_id
        for ann in data["annotations"]:
            if ann["category_id"] == old:
                ann["category_id"] = new_id

    return edit_annotations(change)


def _extra_category(new_id: int):
    return edit_annotations(lambda d: d["categories"].append({"id": new_id, "name": "far"}))


def _categories(count: int):
    """``count`` categories in all (the two used ones first)."""
    return edit_annotations(
        lambda d: d["categories"].extend({"id": 3 + i, "name": f"c{i}"} for i in range(count - len(d["categories"])))
    )


def _images(count: int):
    """``count`` image entries in all (the extra ones without annotations)."""
    return edit_annotations(
        lambda d: d["images"].extend(
            {"id": 100 + i, "file_name": f"x{i}.jpg", "width": 64, "height": 48}
            for i in range(count - len(d["images"]))
        )
    )


def _both(count: int):
    def prepare(case: Path) -> None:
        _categories(count)(case)
        _images(count)(case)

    return prepare


def _too_many_categories() -> int:
    """The fewest categories whose evaluation alone exceeds this machine's memory."""
    return int(machine_memory() // evaluation_memory(1, 1)) + 2


def _too_many_pairs() -> int:
    """A count ``n`` such that ``n`` categories with ``n`` images exceed the memory (and neither alone does)."""
    return math.isqrt(machine_memory() // 32) + 2


CASES = [
    # the examples of the rule
    (
        "category-id-1e9-raw-labels",
        RAW_LABELS,
        [ANN, "'categories[1].id' = 1000000000 with data.contiguous_labels=false", "model.num_classes 1000000001", BIG],
        _category_id(1, 1_000_000_000),
    ),
    (
        "millions-of-categories",
        RESUME,
        [ANN, "'categories' (", "entries) needs at least", "to evaluate", BIG],
        lambda c: _categories(_too_many_categories())(c),
    ),
    # more members of the class
    (
        "too-many-categories-for-a-fresh-run",
        FRESH,
        [ANN, "'categories' (", "entries) needs at least", "to evaluate", BIG],
        lambda c: _categories(_too_many_categories())(c),
    ),
    (
        "unused-category-with-a-huge-id",
        RAW_LABELS,
        [ANN, "'categories[2].id' = 4000000000 with data.contiguous_labels=false", "model.num_classes 4000000001", BIG],
        _extra_category(4_000_000_000),
    ),
    (
        "largest-id-first-in-the-file",
        RAW_LABELS,
        [ANN, "'categories[0].id' = 1099511627776", BIG],
        _category_id(0, 2**40),
    ),
    (
        "too-many-categories-to-evaluate",
        EVAL,
        [ANN, "'categories' (", "to evaluate", BIG],
        lambda c: _categories(_too_many_categories())(c),
    ),
    (
        "categories-times-images",
        EVAL,
        [ANN, "'categories' (", "with 'images' (", "to evaluate", BIG],
        lambda c: _both(_too_many_pairs())(c),
    ),
]


@pytest.mark.parametrize("args, fragments, prepare", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_size_from_the_data_that_cannot_fit_is_one_clear_line(cli, case: Path, args, fragments, prepare) -> None:
    prepare(case)
    before = snapshot(case / OUT)
    result = cli.run(args, cwd=case)
    assert_one_line_error(result, *fragments)
    assert_outputs_kept(before, case / OUT)
    assert not (case / OUT / "raw").exists()


def test_the_evaluation_estimate_is_what_pycocotools_allocates() -> None:
    """The estimate counts exactly pycocotools' tables and per-image list (a lower bound of the whole)."""
    categories, images = 3, 5
    gt = {
        "images": [{"id": i, "width": 10, "height": 10} for i in range(images)],
        "categories": [{"id": c, "name": str(c)} for c in range(categories)],
        "annotations": [{"id": 1, "image_id": 0, "category_id": 0, "bbox": [1, 1, 4, 4], "area": 16.0, "iscrowd": 0}],
    }
    coco = COCO()
    coco.dataset = gt
    coco.createIndex()
    result = coco.loadRes([{"image_id": 0, "category_id": 0, "bbox": [1, 1, 4, 4], "score": 0.9}])
    ev = COCOeval(coco, result, "bbox")
    ev.evaluate()
    ev.accumulate()
    tables = sum(np.asarray(ev.eval[name]).nbytes for name in ("precision", "scores", "recall"))
    assert evaluation_memory(categories, images) == tables + 8 * len(ev.evalImgs)


def test_coco_sized_files_fit() -> None:
    """COCO train2017 (80 categories, 118k images) is not refused on a machine of 8 GiB."""
    if machine_memory() < 8 << 30:
        pytest.skip("a machine with less than 8 GiB of memory")
    data = {"categories": [{}] * 80, "images": [{}] * 118_287}
    check_evaluation_memory(data, "instances_train2017.json")


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([*EVAL, "--scales", "80"], id="eval-at-a-size-the-memory-cannot-hold"),
        pytest.param(["train", *BASE, "train.epochs=1", "data.train_scales=[6000]", "data.train_max_size=8000",
                      f"train.output_dir={OUT / 'big'}"], id="train-at-a-size-the-memory-cannot-hold"),  # fmt: skip
    ],
)
def test_an_allocation_that_fails_is_one_clear_line(cli, case: Path, args) -> None:
    """Sizes inside their ranges that the machine cannot hold end in one line naming what to lower (Rule 9)."""
    before = snapshot(case / OUT)
    result = cli.run(args, cwd=case, limits=[("memory", 1 << 30)])
    assert_one_line_error(result, "out of memory", "lower what the run holds at once", "batch sizes")
    assert_outputs_kept(before, case / OUT)
