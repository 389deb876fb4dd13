"""The memory bound of the annotations of one image (the matcher's cost tables), through the real check.

The other sizes of an annotation file (categories, images, the largest id)
run through the command line in ``tests/reliability/test_data_sizes.py``; an
image with millions of boxes needs an annotation file of hundreds of MiB
there, so here the parsed data is built in memory (one annotation object
repeated) and given to the check that training runs before building a model.
"""

from __future__ import annotations

import pytest

from detr_peg.config import load_config
from detr_peg.config.ranges import machine_memory
from detr_peg.data.dataset_memory import check_matching_memory, matching_memory
from detr_peg.errors import DataError


def _data(boxes: int, crowd: int = 0) -> dict:
    return {
        "annotations": [{"image_id": 7, "iscrowd": crowd}] * boxes + [{"image_id": 8}] * 3,
        "images": [{"id": 7}, {"id": 8}],
        "categories": [{"id": 1}],
    }


def _too_many(cfg) -> int:
    """The fewest boxes of one image whose matching with ``cfg``'s batch and queries exceeds the memory."""
    sizes = {"train.batch_size": cfg.train.batch_size, "model.num_queries": cfg.model.num_queries}
    return int(machine_memory() // matching_memory(sizes.__getitem__, 1)) + 1


def test_an_image_with_more_boxes_than_matching_can_hold_is_refused() -> None:
    cfg = load_config(None, [])
    boxes = _too_many(cfg)
    with pytest.raises(DataError) as info:
        check_matching_memory(cfg, _data(boxes), "train.json")
    message = str(info.value)
    assert message.startswith(f"Annotation file train.json: image id 7 has {boxes} annotations"), message
    assert "more than this machine has" in message


def test_the_need_follows_the_config_values_below_their_defaults() -> None:
    """One query compares each box once: the image refused with 100 queries fits."""
    boxes = _too_many(load_config(None, []))
    check_matching_memory(load_config(None, ["model.num_queries=1"]), _data(boxes), "train.json")


def test_large_config_values_do_not_refuse_ordinary_data() -> None:
    """Large queries and batches count as their defaults (the loader bounds them): 1,000 boxes in one image pass."""
    cfg = load_config(None, ["model.num_queries=5000", "train.batch_size=64"])
    check_matching_memory(cfg, _data(1000), "train.json")


def test_crowd_annotations_are_not_matched() -> None:
    cfg = load_config(None, [])
    check_matching_memory(cfg, _data(_too_many(cfg), crowd=1), "train.json")
