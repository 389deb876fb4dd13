"""``train.save_best`` and ``train.early_stop``, checked against the evaluations a run logged."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.engine.training import idle_settings, run_training
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

EVERY_ITERATION = ["train.eval_every_iters=1", "train.epochs=100", "train.batch_size=2", "train.lr=0.001"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return synthetic_data(tmp_path_factory.mktemp("shapes"))


def _evaluations(run: Path, metric: str) -> list[tuple[int, float]]:
    records = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):  # the half-written line of a killed run, and what follows on it
            records.append(json.loads(line))
    return [(r["iteration"], r[metric]) for r in records if r["type"] == "eval"]


def _best(evaluations: list[tuple[int, float]]) -> tuple[int, float]:
    best = evaluations[0]
    for iteration, value in evaluations[1:]:
        if value > best[1]:
            best = (iteration, value)
    return best


def _train(shapes, run: Path, *extra: str):
    overrides = synthetic_overrides(shapes, run, *EVERY_ITERATION, *extra)
    return run_training(tiny_config(overrides), progress_bars=False)


def test_the_best_checkpoint_is_the_best_logged_evaluation_and_a_resume_keeps_it(shapes, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(shapes, run, "train.max_iters=3", "train.save_best=AP50")
    iteration, value = _best(_evaluations(run, "AP50"))
    stored = read_checkpoint(run / "checkpoint_best.pth")
    assert stored.extra["best"] == {"metric": "AP50", "value": value, "iteration": iteration}
    assert stored.extra["iteration"] == iteration
    if iteration == 3:  # the last evaluation was the best: its weights are the run's last evaluated weights
        last = read_checkpoint(run / "checkpoint.pth").state_dict
        for key, tensor in stored.state_dict.items():
            torch.testing.assert_close(tensor, last[key], rtol=0, atol=0)
    with (run / "metrics.jsonl").open("a") as log:  # a line a killed run left half-written
        log.write('{"type": "eval", "iteration": 3, "AP5')
    _train(shapes, run, "train.max_iters=5", "train.save_best=AP50", "train.resume=true")
    evaluations = _evaluations(run, "AP50")
    assert [i for i, _ in evaluations] == [1, 2, 3, 4, 5]
    iteration, value = _best(evaluations)
    assert read_checkpoint(run / "checkpoint_best.pth").extra["best"] == {
        "metric": "AP50",
        "value": value,
        "iteration": iteration,
    }


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stop_ends_the_run_after_that_many_evaluations_without_a_better_one(
    shapes, tmp_path: Path, patience: int
) -> None:
    run = tmp_path / "run"
    result = _train(shapes, run, "train.max_iters=8", f"train.early_stop={patience}")
    evaluations = _evaluations(run, "AP")
    expected, since, best, best_at, stop = (
        8,
        0,
        None,
        None,
        None,
    )  # where the rule says the run ends, from the values it logged
    for iteration, value in evaluations:
        since = 0 if best is None or value > best else since + 1
        best, best_at = (value, iteration) if since == 0 else (best, best_at)
        if since >= patience:
            expected = iteration
            stop = {
                "type": "early_stop",
                "iteration": iteration,
                "metric": "AP",
                "best": best,
                "best_iteration": best_at,
            }
            break
    assert evaluations[-1][0] == expected and result.iterations == expected
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stops = [{k: v for k, v in r.items() if k != "time"} for r in records if r["type"] == "early_stop"]
    assert stops == ([stop] if stop else [])
    assert not (run / "checkpoint_best.pth").exists()  # early_stop alone keeps no best checkpoint


def test_an_undefined_metric_is_not_ranked(shapes, tmp_path: Path, caplog) -> None:
    """The shapes are smaller than 96 x 96: APl is pycocotools' -1, which must not be 'best' nor stop the run."""
    caplog.set_level(logging.INFO, logger="detr_peg")
    run = tmp_path / "run"
    result = _train(shapes, run, "train.max_iters=4", "train.save_best=APl", "train.early_stop=1")
    assert [value for _, value in _evaluations(run, "APl")] == [-1.0] * 4
    assert result.iterations == 4 and not (run / "checkpoint_best.pth").exists()
    assert "APl is undefined at iteration 4 (no objects of its size in the validation data)" in caplog.text


@pytest.mark.parametrize(
    "settings, has_val, note",
    [
        (["train.save_best=AP"], False, "train.save_best=AP writes no checkpoint_best.pth: the run has no validation"),
        (["train.early_stop=2"], False, "train.early_stop=2 cannot end the run: it has no validation data"),
        (["train.early_stop=2", "train.eval_every=0"], True, "train.early_stop=2 cannot end the run: it evaluates"),
        (["train.early_stop=2", "train.epochs=3", "train.eval_every=3"], True, "cannot end the run: it evaluates"),
        (["train.reset_classifier=true"], True, "train.reset_classifier=true does nothing without train.init_from"),
        (["train.lr=0", "train.lr_backbone=0"], True, "train.lr and train.lr_backbone are 0: the weights do not"),
        (["train.warmup_iters=50", "train.max_iters=50"], True, "train.warmup_iters=50 is not shorter than the run"),
        (["train.lr=0"], True, None),
        (["train.warmup_iters=49", "train.max_iters=50"], True, None),
        (["train.early_stop=2", "train.epochs=3", "train.eval_every=2"], True, None),
        (["train.early_stop=2", "train.eval_every=0", "train.eval_every_iters=5"], True, None),
        (["train.save_best=AP", "train.reset_classifier=true", "train.init_from=x.pth"], True, None),
    ],
)
def test_settings_the_run_cannot_act_on_are_named(settings: list[str], has_val: bool, note: str | None) -> None:
    notes = idle_settings(tiny_config(settings), has_val)
    assert len(notes) == (note is not None) and all(note in n for n in notes)


def test_the_run_log_carries_the_note(shapes, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="detr_peg")
    _train(shapes, tmp_path / "run", "train.max_iters=1", "train.eval_every_iters=0", "train.early_stop=1",
           "train.eval_every=0")  # fmt: skip
    assert "Note: train.early_stop=1 cannot end the run: it evaluates only at the end" in caplog.text


def test_a_resume_past_its_iteration_budget_says_so(shapes, tmp_path: Path, caplog) -> None:
    run = tmp_path / "run"
    _train(shapes, run, "train.max_iters=3", "train.eval_every=0")
    caplog.set_level(logging.INFO, logger="detr_peg")
    result = _train(shapes, run, "train.max_iters=2", "train.eval_every=0", "train.resume=true")
    assert result.iterations == 3
    assert "Note: train.max_iters=2 was reached before (the checkpoint is at iteration 3): nothing is left" in (
        caplog.text
    )


def test_a_resume_ranks_only_the_logged_values_a_run_can_write(tmp_path: Path) -> None:
    """Numbers beyond float32 read as NaN, a string as no value: neither becomes the best (a NaN best was never beaten)."""
    from types import SimpleNamespace

    from detr_peg.engine.hooks import BestHook

    lines = [{"type": "eval", "iteration": 1, "AP": 1e308}, {"type": "eval", "iteration": 2, "AP": "high"},
             {"type": "eval", "iteration": 3, "AP": 20.0}, {"type": "eval", "iteration": 4, "AP": 10.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    hook = BestHook(evaluations=None)
    hook._recall(SimpleNamespace(out=tmp_path, progress=SimpleNamespace(iteration=5)), "AP")
    assert (hook.best, hook.since) == ((20.0, 3), 1)
