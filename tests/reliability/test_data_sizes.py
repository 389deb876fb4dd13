"""Sizes are bounded by plain ranges, and an allocation that fails anyway is one line (Rule 9).

Sizes that come from an annotation file obey the range of the config field they set: the number of
categories and, with ``data.contiguous_labels=false``, the largest category id make ``model.num_classes``
(at most ``MAX_CLASSES``). A size inside its range that the machine still cannot hold ends in one line
naming what to lower, with exit status 2 and earlier outputs kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detr_peg.config.ranges import MAX_CLASSES
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
BIG = f"more than the {MAX_CLASSES} a model may have"
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


CASES = [
    # the examples of the rule
    (
        "category-id-1e9-raw-labels",
        RAW_LABELS,
        [ANN, "'categories[1].id' = 1000000000 with data.contiguous_labels=false", "model.num_classes 1000000001", BIG],
        _category_id(1, 1_000_000_000),
    ),
    (
        "too-many-categories-on-resume",
        RESUME,
        [ANN, f"'categories' has {MAX_CLASSES + 1} entries", BIG],
        _categories(MAX_CLASSES + 1),
    ),
    # more members of the class
    (
        "too-many-categories-for-a-fresh-run",
        FRESH,
        [ANN, f"'categories' has {MAX_CLASSES + 1} entries", BIG],
        _categories(MAX_CLASSES + 1),
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
        [ANN, f"'categories' has {MAX_CLASSES + 1} entries", BIG],
        _categories(MAX_CLASSES + 1),
    ),
    (
        "just-over-the-bound-by-id",
        RAW_LABELS,
        [ANN, f"model.num_classes {MAX_CLASSES + 1}", BIG],
        _category_id(1, MAX_CLASSES),
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


def test_the_bound_itself_is_accepted(cli, case: Path) -> None:
    """Labels equal to ids up to MAX_CLASSES - 1 make exactly MAX_CLASSES classes, which is allowed."""
    _category_id(1, MAX_CLASSES - 1)(case)
    result = cli.run([*RAW_LABELS, "train.max_iters=1", "train.eval_every=0", "data.val_images=null",
                      "data.val_annotations=null"], cwd=case)  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([*EVAL, "--scales", "80"], id="eval-at-a-size-the-memory-cannot-hold"),
        pytest.param(
            [
                "train",
                *BASE,
                "train.epochs=1",
                "data.train_scales=[6000]",
                "data.train_max_size=8000",
                f"train.output_dir={OUT / 'big'}",
            ],
            id="train-at-a-size-the-memory-cannot-hold",
        ),  # fmt: skip
    ],
)
def test_an_allocation_that_fails_is_one_clear_line(cli, case: Path, args) -> None:
    """Sizes inside their ranges that the machine cannot hold end in one line naming what to lower (Rule 9)."""
    before = snapshot(case / OUT)
    result = cli.run(args, cwd=case, limits=[("memory", 1 << 30)])
    assert_one_line_error(result, "out of memory", "lower what the run holds at once", "batch sizes")
    assert_outputs_kept(before, case / OUT)


def test_an_export_the_memory_cannot_trace_is_refused_before_anything(cli, case: Path) -> None:
    """A fixed batch and size in range that no forward pass fits in is one line before tracing, nothing written; on
    a machine out of memory the kernel would end the export mid-way (exit 137) without a word."""
    args = ["export", "--checkpoint", OUT / "checkpoint.pth", "--output", "big.onnx", "--image-size", "512", "512",
            "--batch-size", "16"]  # fmt: skip
    result = cli.run(args, cwd=case, limits=[("memory", 1 << 30)])
    assert_one_line_error(result, "--batch-size 16 at 512 x 512 pixels needs about 3 GiB to trace and check")
    assert not (case / "big.onnx").exists()
