"""Rule: a checkpoint is checked as a whole before any of it is used; a field that breaks its rule is one line.

Each case corrupts one field of a real training checkpoint (kept loadable with
``weights_only=True``, so only the meaning is wrong) and runs the commands that
read it: ``predict`` and ``train --resume``. Every case must end in exit 2
with one line naming the file and the field, and leave the run folder
byte-identical (``config.yaml``, ``metrics.jsonl`` and the checkpoint included).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.reliability.conftest import IMAGES, OUT, RESUME, assert_one_line_error, assert_outputs_kept, snapshot

CHECKPOINT = OUT / "checkpoint.pth"


def _first_weight(ckpt: dict) -> str:
    return next(k for k, v in ckpt["model"].items() if v.is_floating_point() and v.dim() == 2)


def _set(key: str, value) -> Callable[[dict], str]:
    def change(ckpt: dict) -> str:
        ckpt[key] = value
        return f"'{key}'"

    return change


def _weight_as(make) -> Callable[[dict], str]:
    def change(ckpt: dict) -> str:
        key = _first_weight(ckpt)
        ckpt["model"][key] = make(ckpt["model"][key])
        return f"'model.{key}'"

    return change


def _rng(change_state) -> Callable[[dict], str]:
    def change(ckpt: dict) -> str:
        change_state(ckpt["rng"][0])
        return "'rng[0]'"

    return change


def _label_map(change_map) -> Callable[[dict], str]:
    def change(ckpt: dict) -> str:
        change_map(ckpt["label_map"])
        return "label map"

    return change


def _drop_last_category(label_map: dict) -> None:
    label_map["category_ids"] = label_map["category_ids"][:-1]
    label_map["names"] = label_map["names"][:-1]


def _raw_ids_beyond_the_classes(label_map: dict) -> None:
    label_map["contiguous"] = False
    label_map["category_ids"] = [1, 500]


CASES: dict[str, Callable[[dict], str]] = {
    "epoch is a string": _set("epoch", "3"),
    "iteration is negative": _set("iteration", -1),
    "epoch_batches_done is a bool": _set("epoch_batches_done", True),
    "iteration is a float": _set("iteration", 2.5),
    "optimizer is a list": _set("optimizer", [1, 2]),
    "grad_scaler is a tensor": _set("grad_scaler", torch.zeros(2)),
    "skipped_image_ids holds strings": _set("skipped_image_ids", ["a"]),
    "rng is a string": lambda ckpt: (ckpt.__setitem__("rng", "state"), "'rng'")[1],
    "rng torch state of the wrong shape": _rng(lambda s: s.__setitem__("torch", torch.zeros(3, dtype=torch.uint8))),
    "rng torch state of the wrong dtype": _rng(lambda s: s.__setitem__("torch", s["torch"].float())),
    "rng without a numpy state": _rng(lambda s: s.pop("numpy")),
    "rng python state truncated": _rng(lambda s: s.__setitem__("python", s["python"][:2])),
    "a weight is a Python int": _weight_as(lambda w: 3),
    "a weight is a sparse tensor": _weight_as(lambda w: w.to_sparse()),
    "a weight is a string": _weight_as(lambda w: "weights"),
    "a weight name is not a string": lambda ckpt: (ckpt["model"].__setitem__(7, torch.zeros(1)), "'model'")[1],
    "label_map is a list": _set("label_map", [1, 2]),
    "label map with fewer categories than classes": _label_map(_drop_last_category),
    "label map of raw ids beyond the classes": _label_map(_raw_ids_beyond_the_classes),
    "label map without names": _label_map(lambda m: m.pop("names")),
}


@pytest.mark.parametrize("command", ["predict", "resume"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_a_checkpoint_field_that_breaks_its_rule_is_one_line(cli, case: Path, case_name: str, command: str) -> None:
    ckpt = torch.load(case / CHECKPOINT, weights_only=True)
    field = CASES[case_name](ckpt)
    torch.save(ckpt, case / CHECKPOINT)
    before = snapshot(case / OUT)
    args = {
        "predict": ["predict", "--checkpoint", CHECKPOINT, IMAGES, "--output", "fresh"],
        "resume": RESUME,
    }[command]
    result = cli.run(args, cwd=case)
    assert_one_line_error(result, str(CHECKPOINT), field)
    assert_outputs_kept(before, case / OUT)
    assert not (case / "fresh").exists()


@pytest.mark.parametrize("kind", ["folder", "broken link", "fifo"])
def test_resume_refuses_a_checkpoint_that_is_not_a_regular_file(cli, case: Path, kind: str) -> None:
    path = case / CHECKPOINT
    path.unlink()
    if kind == "folder":
        path.mkdir()
    elif kind == "broken link":
        path.symlink_to(case / "nowhere.pth")
    else:
        import os

        os.mkfifo(path)
    before = {name: data for name, data in snapshot(case / OUT).items()}
    result = cli.run(RESUME, cwd=case)
    assert_one_line_error(result, str(CHECKPOINT), "is not a regular file")
    after = snapshot(case / OUT)
    assert after == before  # config.yaml and metrics.jsonl untouched
