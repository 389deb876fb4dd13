"""Fixtures of the study tests: a tiny base config on a tiny synthetic dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import one_torch_thread, shapes  # noqa: F401  (autouse: single-threaded torch)
from tests.engine.tiny_run import RUN, SMALL_IMAGES, TINY_MODEL, data_overrides

#: Every cell: 8 training images at batch 4, 2 iterations, evaluated after each (the learning curve).
BUDGET = ["train.batch_size=4", "train.max_iters=2", "train.epochs=1", "train.eval_every_iters=1"]


def tiny_overrides(data) -> list[str]:
    """The overrides that make any config a tiny run on ``data`` (a :class:`SyntheticCoco`)."""
    return [
        *TINY_MODEL,
        *SMALL_IMAGES,
        *RUN,
        *BUDGET,
        *data_overrides(data.train_images, data.train_annotations, data.val_images, data.val_annotations),
    ]


def write_base_config(path: Path, extra: str = "") -> Path:
    """A small base config file (DETR); ``extra`` is appended YAML."""
    path.write_text("model:\n  arch: detr\n  aux_loss: true\n" + extra)
    return path


@pytest.fixture
def base_config(tmp_path: Path) -> Path:
    return write_base_config(tmp_path / "base.yaml")
