"""Output-folder checks, atomic training checkpoints, and starting from other weights."""

from __future__ import annotations

import errno
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from detr_peg.config import load_config
from detr_peg.data.label_map import LabelMap
from detr_peg.engine import checkpointing
from detr_peg.engine.checkpointing import (
    Progress,
    check_output_dir,
    load_initial_weights,
    save_training_checkpoint,
)
from detr_peg.engine.optimizer import build_lr_scheduler, build_optimizer
from detr_peg.errors import CheckpointError, TrainingError
from detr_peg.models import build_model
from tests.engine.tiny_run import TINY_MODEL


def _model(num_classes: int):
    cfg = load_config(None, [*TINY_MODEL, "model.backbone.out_stages=[2]", f"model.num_classes={num_classes}"])
    torch.manual_seed(0)
    return cfg, build_model(cfg)


def _label_map(n: int) -> LabelMap:
    return LabelMap(category_ids=list(range(1, n + 1)), names=[f"c{i}" for i in range(n)])


def test_output_folder_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TrainingError, match=r"Output folder .*file/run cannot be created .*train.output_dir"):
        check_output_dir(blocker / "run", 1000)


def test_output_folder_that_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    def refuse(fd):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checkpointing.os, "fsync", refuse)
    with pytest.raises(TrainingError, match="is not writable .Read-only file system"):
        check_output_dir(tmp_path / "run", 1000)
    assert list((tmp_path / "run").iterdir()) == []  # the probe file is removed


def test_too_little_free_space(tmp_path: Path, monkeypatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda p: usage(10 << 30, 10 << 30, 50 << 20))
    with pytest.raises(TrainingError, match=r"has 50 MiB free but a checkpoint needs about 200 MiB"):
        check_output_dir(tmp_path, 200 << 20)
    check_output_dir(tmp_path, 1 << 20)


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    cfg, model = _model(3)
    opt = build_optimizer(model, cfg.train)
    sched = build_lr_scheduler(opt, cfg.train)
    path = tmp_path / "checkpoint.pth"
    kwargs = dict(
        cfg=cfg,
        model=model,
        optimizer=opt,
        lr_scheduler=sched,
        grad_scaler=None,
        label_map=_label_map(3),
        rng_states=[],
        world_size=1,
    )
    save_training_checkpoint(path, progress=Progress(epoch=1, iteration=4), **kwargs)
    before = path.read_bytes()

    def full_disk(obj, f, *args, **kw):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(TrainingError, match="No space left on device.*iteration 8; the previous checkpoint"):
        save_training_checkpoint(path, progress=Progress(epoch=2, iteration=8), **kwargs)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pth"]  # no temporary file left
    assert read_checkpoint(path).extra["iteration"] == 4


def test_init_from_another_class_count_needs_reset_classifier(tmp_path: Path) -> None:
    cfg3, model3 = _model(3)
    src = tmp_path / "three.pth"
    save_checkpoint(src, cfg3, model3.state_dict(), _label_map(3).to_dict())
    _, model5 = _model(5)
    fresh_head = model5.class_embed.weight.detach().clone()
    with pytest.raises(
        CheckpointError, match="trained with 3 classes but this dataset needs 5; set train.reset_classifier=true"
    ):
        load_initial_weights(model5, str(src), num_classes=5, label_map=_label_map(5), reset_classifier=False)
    load_initial_weights(model5, str(src), num_classes=5, label_map=_label_map(5), reset_classifier=True)
    assert torch.equal(model5.class_embed.weight, fresh_head)
    for key, value in model3.state_dict().items():
        if "class_embed" not in key:
            assert torch.equal(model5.state_dict()[key], value), key


def test_init_from_an_official_checkpoint_says_to_convert(tmp_path: Path) -> None:
    official = tmp_path / "detr-r50.pth"
    torch.save({"model": {"backbone.0.body.conv1.weight": torch.zeros(1)}}, official)
    _, model = _model(3)
    with pytest.raises(CheckpointError, match="detr-peg convert"):
        load_initial_weights(model, str(official), num_classes=3, label_map=_label_map(3), reset_classifier=False)


def test_init_from_names_its_field_for_any_unfit_file(tmp_path: Path) -> None:
    """Whatever the file is (a folder, an ONNX graph, another architecture), the message starts at the field."""
    (tmp_path / "run").mkdir()
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    cfg, model = _model(3)
    deformable = load_config(None, [*TINY_MODEL, "model.arch=deformable_detr", "model.num_classes=3"])
    save_checkpoint(tmp_path / "deformable.pth", deformable, build_model(deformable).state_dict(), None)
    expected = {
        "run": r"^train.init_from: The checkpoint file .*run is a folder, not a file",
        "model.onnx": r"^train.init_from: The checkpoint file .*model.onnx is an ONNX graph",
        "deformable.pth": r"^train.init_from .*deformable.pth holds a deformable_detr model but model.arch is detr; "
        r"start from a detr checkpoint, or set model.arch=deformable_detr\.$",
    }
    for name, message in expected.items():
        with pytest.raises(CheckpointError, match=message):
            load_initial_weights(model, str(tmp_path / name), num_classes=3, label_map=_label_map(3),
                                 reset_classifier=False, arch=cfg.model.arch)  # fmt: skip
