"""Non-finite losses and gradients stop training with one line naming the iteration and the term.

Two real command-line runs whose config makes the numbers overflow:

* ``train.lr=1e30``: the first step throws the weights to about 1e30, the
  next forward pass overflows and the losses are NaN at iteration 2; the
  checkpoint of iteration 1 is kept;
* ``loss.giou_loss_coef=1e38`` when resuming: every loss term is finite but
  their weighted sum overflows, so the gradient norm is not finite at the
  first iteration after the resume; the resumed run's checkpoint and the rest
  of its folder stay byte-identical.

A third run, in this process, makes exactly ``loss_giou`` NaN at a chosen
iteration. ``tests/engine/test_training_runs.py`` checks the same through
:func:`run_training`.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.cli.main import main
from detr_peg.models.criterion import SetCriterion
from tests.reliability.conftest import BASE, OUT, RESUME, assert_one_line_error, assert_outputs_kept, snapshot

TERMS = ("loss_ce", "loss_bbox", "loss_giou")


def _all_finite(state: dict[str, torch.Tensor]) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_an_exploding_learning_rate_stops_naming_the_loss_term(cli, case: Path) -> None:
    result = cli.run(
        ["train", *BASE, "train.output_dir=blow", "train.epochs=3", "train.lr=1e30", "train.checkpoint_every=1"],
        cwd=case,
    )
    line = assert_one_line_error(
        result,
        "at iteration 2 (epoch 0)",
        "the last good checkpoint blow/checkpoint.pth (iteration 1) is kept",
        "Lower train.lr",
    )
    term = re.search(r"Non-finite loss term (\w+) \((nan|inf|-inf)\)", line)
    assert term and term.group(1) in TERMS, line
    kept = read_checkpoint(case / "blow" / "checkpoint.pth")
    assert kept.extra["iteration"] == 1 and _all_finite(kept.model)


def test_an_overflowing_loss_weight_stops_naming_the_gradient_norm(cli, case: Path) -> None:
    before = snapshot(case / OUT)
    result = cli.run([*RESUME, "loss.giou_loss_coef=1e38"], cwd=case)
    line = assert_one_line_error(
        result, "at iteration 3 (epoch 1)", "the last good checkpoint out/checkpoint.pth (iteration 2) is kept"
    )
    assert re.search(r"Non-finite gradient norm \((nan|inf)\)", line), line
    assert_outputs_kept(before, case / OUT)


def test_a_nan_loss_term_is_named(case: Path, monkeypatch, capsys) -> None:
    original = SetCriterion.forward
    calls = {"n": 0}

    def forward(self, outputs, targets, **kwargs):
        losses = original(self, outputs, targets, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second iteration after the resume: iteration 4
            losses["loss_giou"] = losses["loss_giou"] * float("nan")
        return losses

    monkeypatch.setattr(SetCriterion, "forward", forward)
    monkeypatch.chdir(case)
    before = snapshot(case / OUT)
    assert main([*RESUME, "train.epochs=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "detr-peg train: error: Non-finite loss term loss_giou (nan) at iteration 4 (epoch 1); training "
        "stopped and the last good checkpoint out/checkpoint.pth (iteration 2) is kept. Lower train.lr, "
        "check the data, or keep train.clip_max_norm > 0."
    )
    assert_outputs_kept(before, case / OUT)
