"""Class 5: a resumed run with changed settings continues correctly or refuses; it never skips data silently.

A checkpoint written in the middle of an epoch (one of two batches of two
images done) is resumed with settings that change what its position means:
another batch size that does not divide the images done, another seed,
another number of processes, another number of training images. Settings
the restored optimizer and schedule would silently override (learning
rates, weight decay, the step schedule) are refused at any point. A batch
size that divides the images done continues from the right image. The table
of rules: :mod:`detr_peg.checkpoint.resume_rules`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from detr_peg.checkpoint.format import read_checkpoint
from tests.reliability.conftest import BASE, IMAGES, OUT, RESUME, assert_success, draw_image, edit_annotations
from tests.reliability.hostile_cases import Hostile, check_refused, ids

MID = Path("mid")
MID_RESUME = ["train", "--resume", *BASE, f"train.output_dir={MID}", "train.epochs=1", "train.max_iters=null"]


@pytest.fixture(scope="session")
def mid_template(template: Path, tmp_path_factory, cli) -> Path:
    """The template plus ``mid/``: a run stopped after one of the two batches of its first epoch."""
    root = tmp_path_factory.mktemp("mid") / "case"
    shutil.copytree(template, root, symlinks=True)
    assert_success(
        cli.run(["train", *BASE, f"train.output_dir={MID}", "train.epochs=1", "train.max_iters=1"], cwd=root)
    )
    extra = read_checkpoint(root / MID / "checkpoint.pth").extra
    assert (extra["epoch"], extra["epoch_batches_done"], extra["train_images"]) == (0, 1, 4)
    return root


@pytest.fixture
def mid_case(mid_template: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "case"
    shutil.copytree(mid_template, folder, symlinks=True)
    return folder


def _fifth_image(case: Path) -> None:
    Image.fromarray(draw_image(5, [[4.0, 6.0, 20.0, 14.0]], [1])).save(case / IMAGES / "img4.jpg")

    def change(data: dict) -> None:
        data["images"].append({"id": 5, "file_name": "img4.jpg", "width": 64, "height": 48})
        data["annotations"].append(
            {"id": 99, "image_id": 5, "category_id": 1, "bbox": [4.0, 6.0, 20.0, 14.0], "area": 280.0, "iscrowd": 0}
        )

    edit_annotations(change)(case)


def _written_by_two_processes(case: Path) -> None:
    path = case / MID / "checkpoint.pth"
    ckpt = torch.load(path, weights_only=True)
    ckpt["world_size"] = 2
    ckpt["rng"] = ckpt["rng"] * 2
    torch.save(ckpt, path)


WHERE = "mid/checkpoint.pth stopped in the middle of epoch 0 after 1 batches of 2 images per process"
MID_CASES = [
    Hostile(
        "batch-size-not-dividing-the-images-done",
        [*MID_RESUME, "train.batch_size=4"],
        [WHERE, "train.batch_size 4 does not divide the 2 images done", "train.batch_size=2"],
    ),
    Hostile("odd-batch-size", [*MID_RESUME, "train.batch_size=3"], ["train.batch_size 3 does not divide"]),
    Hostile("another-seed", [*MID_RESUME, "train.seed=7"], [WHERE, "train.seed is 7 but was 42"]),
    Hostile("another-training-set", MID_RESUME, ["the number of training images is 5 but was 4"], _fifth_image),
    Hostile(
        "another-number-of-processes", MID_RESUME, ["the number of processes is 1 but was 2"], _written_by_two_processes
    ),
]

BOUNDARY_CASES = [
    Hostile(
        "another-learning-rate",
        [*RESUME, "train.lr=1e39"],
        [
            "train.lr is 1e+39 but out/checkpoint.pth was trained with 0.0001",
            "train.lr=0.0001",
            "train.init_from=out/checkpoint.pth",
        ],
    ),
    Hostile("another-backbone-learning-rate", [*RESUME, "train.lr_backbone=0.5"], ["train.lr_backbone is 0.5"]),
    Hostile("another-weight-decay", [*RESUME, "train.weight_decay=0.5"], ["train.weight_decay is 0.5"]),
    Hostile("another-lr-step", [*RESUME, "train.lr_drop=1"], ["train.lr_drop is 1 but"]),
    Hostile("another-warmup", [*RESUME, "train.warmup_iters=20"], ["train.warmup_iters is 20 but"]),
]


@pytest.mark.parametrize("spec", MID_CASES, ids=ids(MID_CASES))
def test_a_setting_that_moves_the_saved_position_is_refused_mid_epoch(cli, mid_case: Path, spec: Hostile) -> None:
    check_refused(cli, mid_case, spec)


@pytest.mark.parametrize("spec", BOUNDARY_CASES, ids=ids(BOUNDARY_CASES))
def test_a_setting_the_restored_optimizer_would_override_is_refused(cli, case: Path, spec: Hostile) -> None:
    check_refused(cli, case, spec)


def test_a_dividing_batch_size_continues_from_the_right_image(cli, mid_case: Path) -> None:
    result = cli.run([*MID_RESUME, "train.batch_size=1"], cwd=mid_case)
    assert_success(result)
    # 2 images done = batch 2 of size 1; the two images left are two more iterations.
    assert "with train.batch_size 1 the epoch continues after batch 2" in result.stdout, result.stdout
    assert "Done: 3 iterations, 1 epochs" in result.stdout, result.stdout
    records = [json.loads(line) for line in (mid_case / MID / "metrics.jsonl").read_text().splitlines()]
    steps = [r["iteration"] for r in records if r.get("type") == "iter"]
    assert steps[-2:] == [2, 3], steps


def test_any_batch_size_applies_from_an_epoch_boundary(cli, case: Path) -> None:
    result = cli.run([*RESUME, "train.batch_size=1"], cwd=case)
    assert_success(result)
    assert "Done: 6 iterations, 2 epochs" in result.stdout, result.stdout


def test_a_checkpoint_of_two_processes_resumed_by_one_warns_in_one_line(cli, case: Path) -> None:
    """At an epoch boundary the run continues; Python's warning is one line of the command, not a source dump."""
    path = case / OUT / "checkpoint.pth"
    ckpt = torch.load(path, weights_only=True)
    ckpt["world_size"], ckpt["rng"] = 2, ckpt["rng"] * 2
    torch.save(ckpt, path)
    result = cli.run(RESUME, cwd=case)
    assert_success(result)
    assert result.stderr.splitlines() == [
        f"detr-peg train: warning: {OUT / 'checkpoint.pth'} was written by 2 processes and this run has 1; the "
        "random generators start fresh, so the run is not an exact continuation."
    ]
