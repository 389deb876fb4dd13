"""Periodic evaluation: the ``eval`` records of ``metrics.jsonl`` are the learning curve (AP against iteration)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES
from detr_peg.engine.training import run_training
from detr_peg.errors import ConfigError
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config


def _eval_records(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "eval"]


@pytest.mark.parametrize(
    "schedule, iterations, epochs",
    [
        (["train.epochs=2", "train.eval_every=1"], [2, 4], [0, 1]),  # every epoch; the last is the final evaluation
        (["train.max_iters=3", "train.eval_every=1", "train.eval_every_iters=1"], [1, 2, 3], [0, 0, 1]),  # each once
    ],
)
def test_eval_records_carry_the_iteration(
    tmp_path: Path, schedule: list[str], iterations: list[int], epochs: list[int]
) -> None:
    """Each record names the iteration and the epoch of its last trained batch, as the ``epoch`` records do."""
    data = synthetic_data(tmp_path / "data")  # 8 training images, batch 4: 2 iterations per epoch
    cfg = tiny_config(synthetic_overrides(data, tmp_path / "run", "train.batch_size=4", *schedule))
    result = run_training(cfg, progress_bars=False)
    records = _eval_records(tmp_path / "run")
    assert [r["iteration"] for r in records] == iterations
    assert [r["epoch"] for r in records] == epochs
    assert all(set(STAT_NAMES) <= set(r) for r in records)
    # metrics.json is the last evaluation
    metrics = json.loads(result.metrics_file.read_text())
    assert metrics["iteration"] == iterations[-1]
    assert metrics["bbox"] == {name: records[-1][name] for name in STAT_NAMES}


def test_negative_eval_every_iters_is_refused(tmp_path: Path) -> None:
    """The loader refuses it; a config made in Python without the loader is checked again by the run."""
    data = synthetic_data(tmp_path / "data")
    overrides = synthetic_overrides(data, tmp_path / "run")
    with pytest.raises(ConfigError, match="'train.eval_every_iters' must be at least 0, got -1"):
        tiny_config([*overrides, "train.eval_every_iters=-1"])
    cfg = tiny_config(overrides)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_every_iters=-1))
    with pytest.raises(
        ConfigError, match="^run_training's config: 'train.eval_every_iters' must be at least 0, got -1"
    ):
        run_training(cfg, progress_bars=False)
    assert not (tmp_path / "run" / "checkpoint.pth").exists()
