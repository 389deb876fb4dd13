"""Set-up helpers: classes from the data, config differences, main-process steps."""

from __future__ import annotations

import pytest

from detr_peg.config import load_config
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.distributed import DistEnv
from detr_peg.engine.run_setup import config_differences, on_main, resolve_num_classes
from detr_peg.errors import ConfigError, TrainingError

COCO_LIKE = LabelMap(category_ids=[1, 2, 90], names=["person", "bicycle", "toothbrush"], contiguous=False)


def test_num_classes_comes_from_the_label_map_when_unset() -> None:
    cfg = resolve_num_classes(load_config(None, []), COCO_LIKE, "train.json")
    assert cfg.model.num_classes == 91
    contiguous = LabelMap(category_ids=[1, 2, 90], names=["a", "b", "c"])
    assert resolve_num_classes(load_config(None, []), contiguous, "train.json").model.num_classes == 3


def test_a_set_num_classes_must_cover_the_labels() -> None:
    assert resolve_num_classes(load_config(None, ["model.num_classes=100"]), COCO_LIKE, "x").model.num_classes == 100
    with pytest.raises(ConfigError, match="model.num_classes is 80 but train.json needs 91 .3 categories, labels "
                                          "equal to the category ids.; remove model.num_classes"):
        resolve_num_classes(load_config(None, ["model.num_classes=80"]), COCO_LIKE, "train.json")


def test_config_differences_ignore_backbone_weights_and_training_settings() -> None:
    a = load_config(None, ["model.backbone.weights=pretrained", "train.lr=1"])
    b = load_config(None, ["model.transformer.dropout=0.0", "data.hflip_prob=0"])
    assert config_differences(a, b) == ["model.transformer.dropout", "data.hflip_prob"]


def test_on_main_runs_only_in_the_main_process() -> None:
    assert on_main(DistEnv(rank=0), lambda: 5) == 5
    assert on_main(DistEnv(rank=1, world_size=1), lambda: 5) is None

    def fail():
        raise TrainingError("disk full")

    with pytest.raises(TrainingError, match="disk full"):
        on_main(DistEnv(rank=0), fail)
