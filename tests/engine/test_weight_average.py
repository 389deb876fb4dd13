"""The exponential moving average of the weights (``train.ema_decay``).

* :class:`WeightAverage` against the formula computed here step by step, on a
  module with parameters, BatchNorm running statistics and an integer buffer;
* a training run with the average: the weights it steps are those of the same
  run without one (the average changes nothing in training), the checkpoint's
  ``model`` is the average, a stopped and resumed run ends with the same
  average and the same stepped weights as a run without a stop, and the
  evaluation at the end of training is that of the average
  (``detr-peg eval`` of the checkpoint gives the same detections).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.engine.evaluation.run import run_evaluation
from detr_peg.engine.weight_average import EMA_UPDATES, TRAIN_WEIGHTS, WeightAverage, ema_decay
from tests.engine.test_training_runs import _run, assert_same_weights
from tests.engine.tiny_run import synthetic_overrides, tiny_config

EMA = ["train.ema_decay=0.9", "train.ema_warmup_iters=2"]


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize("warmup", [0, 3])
def test_average_follows_the_formula_for_parameters_and_buffers(warmup: int) -> None:
    model = _module()
    average = WeightAverage(model, decay=0.8, warmup_iters=warmup)
    expected: dict[str, torch.Tensor] = {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(6):
        model.train()
        loss = model(torch.randn(5, 3)).square().mean()  # moves the parameters and the running statistics
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        average.update(model)
        current = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if step == 0:
            expected = current  # the first update copies the model
        else:
            d = 0.8 * (1 - math.exp(-step / warmup)) if warmup else 0.8
            expected = {k: (d * expected[k] + (1 - d) * v) if v.is_floating_point() else v for k, v in current.items()}
    assert average.updates == 6
    got = average.state_dict()
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], msg=key)
    assert got["1.num_batches_tracked"].item() == 6  # an integer buffer is copied, not averaged
    assert not torch.equal(got["0.weight"], model.state_dict()["0.weight"])
    assert ema_decay(0.8, 3, 0) == 0.0 and ema_decay(0.8, 0, 0) == 0.8


def test_load_restores_the_average_and_its_count() -> None:
    model = _module()
    first = WeightAverage(model, decay=0.5, warmup_iters=0)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        first.update(model)
    second = WeightAverage(_module(), decay=0.5, warmup_iters=0)
    second.load(first.state_dict(), first.updates)
    with torch.no_grad():
        model[0].weight.add_(2.0)
    first.update(model)
    second.update(model)
    assert second.updates == first.updates == 4
    for key, value in first.state_dict().items():
        torch.testing.assert_close(second.state_dict()[key], value)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.1])
def test_decay_outside_the_open_interval_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        WeightAverage(_module(), decay=decay, warmup_iters=0)


def test_training_with_an_average_steps_the_same_weights_and_resumes_exactly(shapes, tmp_path: Path) -> None:
    uninterrupted = read_checkpoint(_run(shapes, tmp_path / "plain", "train.max_iters=6").checkpoint).model
    whole = _run(shapes, tmp_path / "whole", "train.max_iters=6", *EMA)
    stored = read_checkpoint(whole.checkpoint)
    assert stored.extra[EMA_UPDATES] == 6
    # The average changes nothing in training: the stepped weights are those of the run without it.
    assert_same_weights(stored.extra[TRAIN_WEIGHTS], uninterrupted)
    different = [k for k, v in stored.model.items() if v.is_floating_point() and not torch.equal(v, uninterrupted[k])]
    assert different, "the checkpoint's model should be the average, not the stepped weights"

    _run(shapes, tmp_path / "split", "train.max_iters=3", *EMA)
    assert read_checkpoint(tmp_path / "split" / "checkpoint.pth").extra[EMA_UPDATES] == 3
    resumed = read_checkpoint(
        _run(shapes, tmp_path / "split", "train.max_iters=6", "train.resume=true", *EMA).checkpoint
    )
    assert resumed.extra[EMA_UPDATES] == 6
    assert_same_weights(resumed.extra[TRAIN_WEIGHTS], stored.extra[TRAIN_WEIGHTS])
    assert_same_weights(resumed.model, stored.model)


def test_the_run_evaluates_the_average_it_stores(shapes, tmp_path: Path) -> None:
    cfg = tiny_config(
        synthetic_overrides(shapes, tmp_path / "run", "train.max_iters=4", "train.batch_size=2", "train.lr=1e-3", *EMA)
    )
    from detr_peg.engine.training import run_training

    result = run_training(cfg, progress_bars=False)
    stored = read_checkpoint(result.checkpoint)
    assert any(not torch.equal(v, stored.extra[TRAIN_WEIGHTS][k]) for k, v in stored.model.items())
    again = run_evaluation(cfg, result.checkpoint, tmp_path / "eval", progress_bars=False)
    during = json.loads(Path(result.detections_file).read_text())
    after = json.loads(Path(again.detections_file).read_text())
    assert len(during) == len(after) > 0
    for a, b in zip(during, after):
        assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"])
        torch.testing.assert_close(torch.tensor(a["bbox"] + [a["score"]]), torch.tensor(b["bbox"] + [b["score"]]))
