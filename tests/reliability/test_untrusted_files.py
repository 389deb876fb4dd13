"""Files from elsewhere never run code: pickled callables are refused, safetensors work, paths stay in the dataset.

The armed checkpoint holds an object whose unpickling calls
``os.system("touch MARKER")``. The test first proves the file is armed (an
unsafe ``torch.load`` creates the marker), then feeds it
to every command-line entry that reads weights: ``eval --checkpoint``,
``predict --checkpoint``, ``train train.init_from=``, ``train --resume``
(as the run's own ``checkpoint.pth``), ``model.backbone.weights=`` and
``convert``. Each must refuse with one line naming the file and the callable,
and the marker must not exist afterwards.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file

from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from detr_peg.config import load_config
from detr_peg.models import build_model
from tests.reliability.conftest import (
    ANNOTATIONS,
    BASE,
    IMAGES,
    OUT,
    RESUME,
    assert_one_line_error,
    assert_outputs_kept,
    assert_success,
    edit_annotations,
    read_annotations,
    snapshot,
)

CHECKPOINT = OUT / "checkpoint.pth"
NEW_RUN = ["train", *BASE, f"train.output_dir={OUT / 'new'}", "train.epochs=1"]


class _Payload:
    """Unpickling this calls ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _armed_checkpoint(path: Path, marker: Path, template_checkpoint: Path) -> Path:
    """A real detr_peg checkpoint with the payload hidden next to the weights."""
    with open(template_checkpoint, "rb") as f:
        ckpt = torch.load(f, weights_only=True)
    ckpt["label_map"] = {"payload": _Payload(f"touch {marker}"), **(ckpt["label_map"] or {})}
    torch.save(ckpt, path)
    return path


def _fires(path: Path, marker: Path) -> bool:
    """Whether an unsafe load of ``path`` runs the payload (it only creates ``marker``)."""
    torch.load(path, weights_only=False)
    fired = marker.exists()
    marker.unlink(missing_ok=True)
    return fired


@pytest.fixture
def armed(case: Path) -> tuple[Path, Path]:
    marker = case / "MARKER"
    path = _armed_checkpoint(case / "armed.pth", marker, case / CHECKPOINT)
    assert _fires(path, marker), "the armed checkpoint does not run its payload when loaded unsafely"
    return path, marker


ENTRIES = {
    "eval": ["eval", "--checkpoint", "armed.pth", "--output", OUT],
    "predict": ["predict", "--checkpoint", "armed.pth", IMAGES, "--output", OUT / "predictions"],
    "train-init-from": [*NEW_RUN, "train.init_from=armed.pth"],
    "train-backbone-weights": [*NEW_RUN, "model.backbone.weights=armed.pth"],
    "train-resume": RESUME,
    "convert": ["convert", "armed.pth", OUT / "converted.pth"],
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_pickled_callable_is_refused_and_never_runs(cli, case: Path, armed, entry: str) -> None:
    path, marker = armed
    checkpoint = str(CHECKPOINT) if entry == "train-resume" else "armed.pth"
    if entry == "train-resume":
        shutil.copyfile(path, case / CHECKPOINT)
    before = snapshot(case / OUT)
    result = cli.run(ENTRIES[entry], cwd=case)
    assert_one_line_error(result, checkpoint, "holds a pickled Python object", "system", "refusing to load it")
    assert not marker.exists(), "the payload ran"
    assert_outputs_kept(before, case / OUT)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_plain_pickle_with_a_callable_is_refused(cli, case: Path, protocol: int) -> None:
    marker = case / "MARKER"
    with open(case / "plain.pkl", "wb") as f:
        pickle.dump({"model": _Payload(f"touch {marker}")}, f, protocol=protocol)
    with open(case / "plain.pkl", "rb") as f:
        pickle.load(f)
    assert marker.exists(), "the plain pickle does not run its payload when unpickled"
    marker.unlink()
    result = cli.run(["eval", "--checkpoint", "plain.pkl", "--output", OUT], cwd=case)
    line = assert_one_line_error(result, "plain.pkl")
    assert "holds a pickled Python object" in line or "not a PyTorch checkpoint" in line, line
    assert not marker.exists(), "the payload ran"


def test_a_pickled_model_object_is_refused_naming_its_class(cli, case: Path) -> None:
    torch.save(torch.nn.Linear(2, 2), case / "module.pth")
    result = cli.run(["eval", "--checkpoint", "module.pth", "--output", OUT], cwd=case)
    assert_one_line_error(result, "module.pth", "torch.nn.modules.linear.Linear", "save a state dict")


def test_python_tags_in_config_files_and_overrides_never_run(cli, case: Path) -> None:
    marker = case / "MARKER"
    (case / "evil.yaml").write_text(f"train:\n  lr: !!python/object/apply:os.system ['touch {marker}']\n")
    result = cli.run([*RESUME, "--config", "evil.yaml"], cwd=case)
    assert_one_line_error(result, "evil.yaml", "invalid YAML at line 2", "python/object/apply:os.system")
    result = cli.run([*RESUME, f"train.lr=!!python/object/apply:os.system ['touch {marker}']"], cwd=case)
    assert_one_line_error(result, "'train.lr' must be a number", "!!python/object/apply:os.system")
    assert not marker.exists()


def test_a_pickle_named_safetensors_is_not_unpickled(cli, case: Path, armed) -> None:
    path, marker = armed
    shutil.copyfile(path, case / "armed.safetensors")
    result = cli.run(["eval", "--checkpoint", "armed.safetensors", "--output", OUT], cwd=case)
    assert_one_line_error(result, "armed.safetensors", "not a valid safetensors file")
    assert not marker.exists()


def test_a_safetensors_suffix_in_any_case_is_safetensors(case: Path) -> None:
    """``w.SAFETENSORS`` is written and read as safetensors, never as a torch zip under that name."""
    from safetensors.torch import load_file

    ckpt = read_checkpoint(case / CHECKPOINT)
    save_checkpoint(case / "w.SAFETENSORS", ckpt.config, ckpt.model, ckpt.label_map)
    torch.testing.assert_close(load_file(case / "w.SAFETENSORS"), ckpt.model, rtol=0, atol=0)
    torch.testing.assert_close(read_checkpoint(case / "w.SAFETENSORS").model, ckpt.model, rtol=0, atol=0)


def test_safetensors_weights_are_accepted_everywhere(cli, case: Path) -> None:
    ckpt = read_checkpoint(case / CHECKPOINT)
    save_checkpoint(case / "model.safetensors", ckpt.config, ckpt.model, ckpt.label_map)
    assert_success(cli.run(["eval", "--checkpoint", "model.safetensors", "--output", "from_safetensors"], cwd=case))
    assert_success(cli.run(["eval", "--checkpoint", CHECKPOINT, "--output", "from_pth"], cwd=case))
    for name in ("metrics.json", "detections.json"):
        a = json.loads((case / "from_safetensors" / name).read_text())
        b = json.loads((case / "from_pth" / name).read_text())
        if name == "metrics.json":
            a, b = a["bbox"], b["bbox"]
        assert a == b, name
    assert_success(cli.run(["predict", "--checkpoint", "model.safetensors", IMAGES, "--output", "pred"], cwd=case))
    assert_success(cli.run([*NEW_RUN, "train.init_from=model.safetensors", "train.max_iters=1"], cwd=case))
    tuned = read_checkpoint(case / OUT / "new" / "checkpoint.pth")
    assert tuned.extra["iteration"] == 1
    # Backbone weights: a torchvision state dict, or a detector checkpoint (its backbone part).
    body = torchvision.models.resnet18()
    save_file({k: v.contiguous() for k, v in body.state_dict().items()}, case / "resnet18.safetensors")
    for weights, expected in (
        ("resnet18.safetensors", body.state_dict()["layer1.0.conv1.weight"]),
        ("model.safetensors", ckpt.model["backbone.body.layer1.0.conv1.weight"]),
    ):
        cfg = load_config(None, [*BASE, "model.num_classes=2", f"model.backbone.weights={case / weights}"])
        torch.testing.assert_close(build_model(cfg).backbone.body.layer1[0].conv1.weight, expected, rtol=0, atol=0)
        assert_success(
            cli.run(
                [
                    "train",
                    *BASE,
                    f"train.output_dir={OUT / weights}",
                    "train.max_iters=1",
                    f"model.backbone.weights={weights}",
                ],
                cwd=case,
            )
        )


@pytest.mark.parametrize("name", ["sub/../../outside.jpg", "..\\outside.jpg", "images/../../outside.jpg"])
def test_image_paths_cannot_leave_the_image_folder(cli, case: Path, name: str) -> None:
    shutil.copyfile(case / IMAGES / "img0.jpg", case / "outside.jpg")
    shutil.copyfile(case / IMAGES / "img0.jpg", case / "data" / "outside.jpg")
    edit_annotations(lambda d: d["images"][2].update(file_name=name))(case)
    before = snapshot(case / OUT)
    result = cli.run(RESUME, cwd=case)
    assert_one_line_error(result, str(ANNOTATIONS), "image id 3", "leaves the image folder")
    assert_outputs_kept(before, case / OUT)
    # Skipping leaves the image out of the dataset: it is never read.
    assert_success(cli.run([*RESUME, "data.on_bad_sample=skip"], cwd=case))
    starts = [json.loads(line) for line in (case / OUT / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_images"] for r in starts if r["type"] == "start"][-1] == 3
    assert len(read_annotations(case)["images"]) == 4
