"""Whole training runs in this process on a tiny model and synthetic shapes.

Exact resume: a run stopped after 3 of 6 iterations (mid-epoch, the
iteration budget ``train.max_iters`` acting as the interruption) and resumed
with ``train.resume`` ends with weights identical (``torch.equal``) to a run of
6 iterations without a stop. Dropout, random flips and crops stay on, the
learning rate drops after every epoch, and the two halves use different
numbers of data-loader workers.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.engine.training import run_training
from detr_peg.errors import CheckpointError, DataError, OutputError, TrainingError
from detr_peg.models.criterion import SetCriterion
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config

# Four iterations per epoch (8 images, batch 2); no validation set; StepLR every epoch.
RESUME = [
    "model.backbone.out_stages=[2]",
    "train.batch_size=2",
    "train.epochs=3",
    "train.lr_drop=1",
    "train.lr=1e-3",
    "data.crop_prob=0.5",
    "data.hflip_prob=0.5",
    "data.val_images=null",
    "data.val_annotations=null",
    "train.deterministic=true",
]


def resume_overrides(shapes, out: Path, *extra: str) -> list[str]:
    return synthetic_overrides(shapes, out, *RESUME, *extra)


def _run(shapes, out: Path, *extra: str):
    return run_training(tiny_config(synthetic_overrides(shapes, out, *RESUME, *extra)), progress_bars=False)


@pytest.fixture
def uninterrupted(shapes, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights after 6 iterations without a stop (function scope: it must run with the
    test's thread count, as float sums depend on how work is split over threads)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = _run(shapes, out, "train.max_iters=6")
    assert result.iterations == 6 and result.epochs_completed == 1
    return read_checkpoint(result.checkpoint).model


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, first: {different[:3]}"


def test_stopped_and_resumed_run_ends_with_the_same_weights(shapes, uninterrupted, tmp_path: Path) -> None:
    first = _run(shapes, tmp_path, "train.max_iters=3")
    ckpt = read_checkpoint(first.checkpoint)
    assert (ckpt.extra["epoch"], ckpt.extra["epoch_batches_done"], ckpt.extra["iteration"]) == (0, 3, 3)
    second = _run(shapes, tmp_path, "train.max_iters=6", "train.resume=true", "data.num_workers=2")
    assert second.iterations == 6
    assert_same_weights(read_checkpoint(second.checkpoint).model, uninterrupted)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in records if r["type"] == "start"]
    assert [s["resumed_iteration"] for s in starts] == [0, 3]
    assert [r["iteration"] for r in records if r["type"] == "iter"] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(TrainingError, match="already holds the checkpoint of a training run.*--resume"):
        _run(shapes, tmp_path, "train.max_iters=8")  # a new run must not overwrite it silently


def _nan_at(call: int, term: str, monkeypatch) -> None:
    original = SetCriterion.forward
    calls = {"n": 0}

    def forward(self, outputs, targets, **kwargs):
        losses = original(self, outputs, targets, **kwargs)
        calls["n"] += 1
        if calls["n"] == call:
            losses[term] = losses[term] * float("nan")
        return losses

    monkeypatch.setattr(SetCriterion, "forward", forward)


@contextlib.contextmanager
def _callers_torch_state(state: str):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model must still be built and trained in float32
    try:
        with torch.no_grad() if state == "no_grad" else torch.inference_mode():
            yield
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("state", ["no_grad", "inference_mode"])
def test_training_is_the_same_whatever_the_callers_torch_state(shapes, uninterrupted, tmp_path, state) -> None:
    with _callers_torch_state(state):
        result = _run(shapes, tmp_path / "run", "train.max_iters=6")
    assert_same_weights(read_checkpoint(result.checkpoint).model, uninterrupted)


def test_non_finite_loss_stops_naming_iteration_and_term(shapes, tmp_path: Path, monkeypatch) -> None:
    _nan_at(6, "loss_giou", monkeypatch)
    with pytest.raises(TrainingError) as info:
        _run(shapes, tmp_path, "train.max_iters=8")
    message = str(info.value)
    assert "Non-finite loss term loss_giou (nan) at iteration 6 (epoch 1)" in message
    assert f"the last good checkpoint {tmp_path / 'checkpoint.pth'} (iteration 4) is kept" in message
    kept = read_checkpoint(tmp_path / "checkpoint.pth")
    assert kept.extra["iteration"] == 4 and kept.extra["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in kept.model.values() if v.is_floating_point())


def test_non_finite_gradient_norm_stops(shapes, tmp_path: Path, monkeypatch) -> None:
    original = torch.nn.utils.clip_grad_norm_
    calls = {"n": 0}

    def clip(params, max_norm, *args, **kwargs):
        calls["n"] += 1
        norm = original(params, max_norm, *args, **kwargs)
        return norm * float("inf") if calls["n"] == 2 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    with pytest.raises(
        TrainingError,
        match=r"Non-finite gradient norm \(inf\) at iteration 2 \(epoch 0\); "
        "training stopped and no checkpoint was written yet",
    ):
        _run(shapes, tmp_path, "train.max_iters=3")


def test_unreadable_images_are_skipped_and_counted_or_fatal(shapes, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(shapes.root, root)
    broken = sorted((root / "train").iterdir())[5]
    broken.write_bytes(b"\xff\xd8 truncated")
    data = synthetic_data(root)
    result = run_training(
        tiny_config(
            synthetic_overrides(
                data, tmp_path / "skip", *RESUME, "train.max_iters=4", "data.on_bad_sample=skip", "data.num_workers=2"
            )
        ),
        progress_bars=False,
    )
    assert result.skipped_images == 1
    epoch = [json.loads(line) for line in result.metrics_log.read_text().splitlines() if '"epoch"' in line][-1]
    assert epoch["type"] == "epoch" and epoch["skipped_images"] == 1
    images = json.loads(data.train_annotations.read_text())["images"]
    broken_id = next(img["id"] for img in images if img["file_name"].endswith(broken.name))
    assert read_checkpoint(result.checkpoint).extra["skipped_image_ids"] == [broken_id]

    with pytest.raises(DataError) as info:
        run_training(
            tiny_config(
                synthetic_overrides(data, tmp_path / "error", *RESUME, "train.max_iters=4", "data.num_workers=2")
            ),
            progress_bars=False,
        )
    message = str(info.value)
    assert str(broken) in message and "Traceback" not in message and "\n" not in message


def test_unwritable_output_folder_fails_before_training(shapes, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(OutputError, match="not-a-folder is a file, not a folder; choose another path"):
        _run(shapes, blocker / "run", "train.max_iters=2")


def test_init_from_needs_reset_classifier_for_another_class_count(shapes, tmp_path: Path) -> None:
    source = _run(shapes, tmp_path / "source", "train.max_iters=1")
    assert source.num_classes == 4
    # Raw category ids as labels: 5 logits (ids 1..4 plus the unused 0).
    other = ["data.contiguous_labels=false", f"train.init_from={source.checkpoint}", "train.max_iters=1"]
    with pytest.raises(CheckpointError, match="trained with 4 classes but this dataset needs 5"):
        _run(shapes, tmp_path / "refused", *other)
    tuned = _run(shapes, tmp_path / "tuned", *other, "train.reset_classifier=true")
    assert tuned.num_classes == 5 and tuned.iterations == 1


def test_warmup_rises_per_iteration_and_resumes_mid_warmup(shapes, tmp_path: Path) -> None:
    """The logged learning rate of every iteration: linear warm-up over 6 iterations, the drop after the first epoch
    (4 iterations) multiplying the rising rate, and a stop after 3 iterations continuing where it was."""
    extra = ("train.warmup_iters=6", "train.log_every=1")
    _run(shapes, tmp_path, "train.max_iters=3", *extra)
    _run(shapes, tmp_path, "train.max_iters=8", "train.resume=true", *extra)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr_transformer"] for r in records if r["type"] == "iter"]
    # Iteration k (1-based) trains at the warm-up factor of k - 1 finished steps, times 0.1 from epoch 1 on.
    warm = [1e-3 * (0.001 + 0.999 * min(done, 6) / 6) for done in range(8)]
    assert lrs == pytest.approx([w * (1.0 if i < 4 else 0.1) for i, w in enumerate(warm)])


def test_eta_is_the_rest_of_the_run_at_the_epochs_pace(shapes, tmp_path: Path) -> None:
    """6 of 3 x 4 iterations: each logged eta is the epoch's mean iteration time so far times the iterations left."""
    _run(shapes, tmp_path, "train.max_iters=6", "train.log_every=1")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r["type"] == "iter"]
    assert [r["iteration"] for r in iters] == [1, 2, 3, 4, 5, 6]
    for r in iters:
        in_epoch = [x["iter_time"] for x in iters if x["epoch"] == r["epoch"] and x["iteration"] <= r["iteration"]]
        expected = sum(in_epoch) / len(in_epoch) * (6 - r["iteration"])
        assert r["eta"] == pytest.approx(expected, abs=0.01 + 1e-4 * len(in_epoch) * 6), r
    assert iters[-1]["eta"] == 0 and iters[0]["eta"] > 0


def test_a_run_leaves_the_callers_random_generators_as_they_were(shapes, tmp_path) -> None:
    """A run seeds torch, Python and NumPy for itself; the program that called it gets its own sequences back."""
    torch.manual_seed(123), random.seed(4), np.random.seed(5)
    expected = (torch.rand(3), random.random(), np.random.rand(3))
    torch.manual_seed(123), random.seed(4), np.random.seed(5)
    _run(shapes, tmp_path / "run", "train.max_iters=1")
    after = (torch.rand(3), random.random(), np.random.rand(3))
    torch.testing.assert_close(after[0], expected[0], rtol=0, atol=0)
    assert after[1] == expected[1] and (after[2] == expected[2]).all()


def test_runs_in_two_threads_give_the_weights_of_runs_one_after_the_other(shapes, uninterrupted, tmp_path) -> None:
    """The runs share the process's generators, so they take turns; each ends as it would alone."""
    import threading

    results, errors = {}, []

    def train(name: str) -> None:
        try:
            results[name] = _run(shapes, tmp_path / name, "train.max_iters=6")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(name,)) for name in ("a", "b")]
    torch.set_default_dtype(torch.float64)  # the caller's, which each run changes and puts back
    try:
        [thread.start() for thread in threads]
        [thread.join() for thread in threads]
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert not errors, errors
    for name in ("a", "b"):
        assert_same_weights(read_checkpoint(results[name].checkpoint).model, uninterrupted)


def test_resuming_a_run_that_ended_evaluates_nothing_again(shapes, tmp_path) -> None:
    """`--resume` of a finished run has nothing to train: its last evaluation is not repeated or recorded twice."""
    overrides = synthetic_overrides(shapes, tmp_path / "run", "train.max_iters=2", "train.batch_size=2",
                                    "model.backbone.out_stages=[2]", "train.save_best=AP")  # fmt: skip
    first = run_training(tiny_config(overrides), progress_bars=False)
    files = {name: (tmp_path / "run" / name).read_bytes() for name in ("metrics.json", "checkpoint_best.pth")}
    again = run_training(tiny_config([*overrides, "train.resume=true"]), progress_bars=False)
    records = [json.loads(line) for line in first.metrics_log.read_text().splitlines()]
    assert [r["iteration"] for r in records if r.get("type") == "eval"] == [2]
    assert again.metrics == first.metrics and again.iterations == 2
    assert {name: (tmp_path / "run" / name).read_bytes() for name in files} == files


def test_weights_that_do_not_fit_name_the_model_settings_apart(shapes, tmp_path) -> None:
    """Resuming or starting from a checkpoint of another model size names the setting, not only a tensor."""
    first = _run(shapes, tmp_path / "a", "train.max_iters=1")
    queries = read_checkpoint(first.checkpoint).config.model.num_queries
    apart = f"; the model settings differ: model.num_queries {queries} in the checkpoint, {queries + 1} here."
    with pytest.raises(CheckpointError) as resumed:
        _run(shapes, tmp_path / "a", "train.max_iters=2", "train.resume=true", f"model.num_queries={queries + 1}")
    assert str(resumed.value).startswith(f"Checkpoint {first.checkpoint} does not fit the model: 'query_embed.weight'")
    assert str(resumed.value).endswith(apart)
    with pytest.raises(CheckpointError) as started:
        _run(shapes, tmp_path / "b", "train.max_iters=1", f"train.init_from={first.checkpoint}",
             f"model.num_queries={queries + 1}")  # fmt: skip
    assert str(started.value).startswith(f"train.init_from {first.checkpoint} does not fit the model")
    assert str(started.value).endswith(apart)


def test_resume_without_a_config_reads_the_runs_own(shapes, tmp_path) -> None:
    from detr_peg.cli.main import main

    out = tmp_path / "run"
    assert main(["train", *synthetic_overrides(shapes, out, *RESUME, "train.max_iters=1")]) == 0
    assert main(["train", "--output", str(out), "--resume", "train.max_iters=2"]) == 0
    assert read_checkpoint(out / "checkpoint.pth").extra["iteration"] == 2
