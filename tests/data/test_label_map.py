"""LabelMap: category ids <-> model labels, and its checkpoint form."""

from __future__ import annotations

import json

import pytest
import torch

from detr_peg.data.label_map import LabelMap
from detr_peg.errors import DataError

CATEGORIES = [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}, {"id": 18, "name": "dog"}]


def test_contiguous_sorts_ids() -> None:
    lm = LabelMap.from_coco_categories(CATEGORIES)
    assert lm.num_classes == 3 and len(lm) == 3
    assert lm.category_ids == [1, 18, 90]
    assert lm.names == ["person", "dog", "toothbrush"]
    assert [lm.label_of(c) for c in (1, 18, 90)] == [0, 1, 2]
    assert [lm.category_id_of(label) for label in range(3)] == [1, 18, 90]
    assert lm.name_of(2) == "toothbrush"
    torch.testing.assert_close(lm.labels_to_category_ids(torch.tensor([2, 0, 1, 1])), torch.tensor([90, 1, 18, 18]))


def test_raw_ids_are_labels() -> None:
    lm = LabelMap.from_coco_categories(CATEGORIES, contiguous=False)
    assert lm.num_classes == 91 and len(lm) == 3
    assert lm.label_of(18) == 18 and lm.category_id_of(90) == 90
    assert lm.name_of(1) == "person"
    torch.testing.assert_close(lm.labels_to_category_ids([18, 5]), torch.tensor([18, 5]))
    with pytest.raises(KeyError):
        lm.category_id_of(5)  # a label that no category uses


def test_unknown_values() -> None:
    lm = LabelMap.from_coco_categories(CATEGORIES)
    with pytest.raises(KeyError):
        lm.label_of(2)
    with pytest.raises(KeyError):
        lm.category_id_of(3)
    with pytest.raises(ValueError, match="0..2"):
        lm.labels_to_category_ids(torch.tensor([0, 3]))
    with pytest.raises(ValueError):
        lm.labels_to_category_ids(torch.tensor([-1]))
    assert lm.labels_to_category_ids(torch.zeros(0, dtype=torch.int64)).shape == (0,)


@pytest.mark.parametrize("contiguous", [True, False])
def test_dict_round_trip_through_json(contiguous: bool) -> None:
    lm = LabelMap.from_coco_categories(CATEGORIES, contiguous=contiguous)
    stored = json.loads(json.dumps(lm.to_dict()))
    restored = LabelMap.from_dict(stored)
    assert restored == lm
    assert restored.num_classes == lm.num_classes
    assert restored.label_of(18) == lm.label_of(18)


def test_from_dict_rejects_garbage() -> None:
    with pytest.raises(DataError, match="category_ids"):
        LabelMap.from_dict({"names": ["a"], "contiguous": True})
    with pytest.raises(DataError):
        LabelMap.from_dict({"category_ids": [1, 1], "names": ["a", "b"], "contiguous": True})


def test_invalid_construction() -> None:
    with pytest.raises(ValueError):
        LabelMap(category_ids=[1, 2], names=["a"])
    with pytest.raises(ValueError):
        LabelMap(category_ids=[], names=[])
    with pytest.raises(ValueError):
        LabelMap(category_ids=[-1], names=["a"])
