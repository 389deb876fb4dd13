"""Set-up helpers: classes from the data, config differences, main-process steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from detr_peg.config import load_config
from detr_peg.config.loader import config_differences
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.distributed import DistEnv, on_main
from detr_peg.errors import ConfigError, TrainingError
from detr_peg.models.loading import resolve_num_classes

COCO_LIKE = LabelMap(category_ids=[1, 2, 90], names=["person", "bicycle", "toothbrush"], contiguous=False)


def test_num_classes_comes_from_the_label_map_when_unset() -> None:
    cfg = resolve_num_classes(load_config(None, []).model, COCO_LIKE, "train.json")
    assert cfg.num_classes == 91
    contiguous = LabelMap(category_ids=[1, 2, 90], names=["a", "b", "c"])
    assert resolve_num_classes(load_config(None, []).model, contiguous, "train.json").num_classes == 3


def test_a_set_num_classes_must_cover_the_labels() -> None:
    assert resolve_num_classes(load_config(None, ["model.num_classes=100"]).model, COCO_LIKE, "x").num_classes == 100
    with pytest.raises(
        ConfigError,
        match="model.num_classes is 80 but train.json has category id 90, and labels equal to the ids need 91 "
        "classes; remove model.num_classes",
    ):
        resolve_num_classes(load_config(None, ["model.num_classes=80"]).model, COCO_LIKE, "train.json")
    contiguous = LabelMap(category_ids=[1, 2, 90], names=["a", "b", "c"])
    for given in (2, 4):  # contiguous labels: one class per category, no more, no fewer
        with pytest.raises(ConfigError, match=f"model.num_classes is {given} but x names 3 categories with contiguous"):
            resolve_num_classes(load_config(None, [f"model.num_classes={given}"]).model, contiguous, "x")
    assert resolve_num_classes(load_config(None, ["model.num_classes=3"]).model, contiguous, "x").num_classes == 3


def test_config_differences_ignore_backbone_weights_and_training_settings() -> None:
    a = load_config(None, ["model.backbone.weights=pretrained", "train.lr=1"])
    b = load_config(None, ["model.transformer.dropout=0.0", "data.hflip_prob=0"])
    assert config_differences(a, b) == ["model.transformer.dropout", "data.hflip_prob"]


def test_on_main_runs_only_in_the_main_process() -> None:
    assert on_main(DistEnv(rank=0), lambda: 5) == 5
    assert on_main(DistEnv(rank=1, world_size=1), lambda: 5) is None

    def fail():
        raise TrainingError("disk full")

    with pytest.raises(TrainingError, match="disk full"):
        on_main(DistEnv(rank=0), fail)


def test_sync_batchnorm_leaves_the_peg_out() -> None:
    """``sync_bn`` on several processes: backbone BatchNorms become SyncBatchNorm, the PEG's masked one does not."""
    import torch
    from torch import nn

    from detr_peg.engine.training import wrap_sync_batchnorm
    from detr_peg.models import build_model
    from detr_peg.models.position.peg import PEG
    from tests.engine.tiny_run import TINY_MODEL

    cfg = load_config(
        None, [*TINY_MODEL, "model.backbone.norm=sync_bn", "model.position.name=peg", "model.num_classes=2"]
    )
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="^model.backbone.norm=sync_bn synchronises BatchNorm over CUDA devices only"):
        wrap_sync_batchnorm(build_model(cfg), cfg, DistEnv(rank=0, world_size=2))  # on the CPU: gloo, no SyncBatchNorm
    model = wrap_sync_batchnorm(build_model(cfg), cfg, DistEnv(rank=0, world_size=2, device=torch.device("cuda")))
    pegs = [m for m in model.modules() if isinstance(m, PEG)]
    assert pegs and all(type(p.norm) is nn.BatchNorm2d for p in pegs)
    synced = [name for name, m in model.named_modules() if isinstance(m, nn.SyncBatchNorm)]
    assert synced and all(name.startswith("backbone.") for name in synced), synced


def test_json_and_config_files_are_synced_before_they_replace_the_old_ones(tmp_path, monkeypatch) -> None:
    """``metrics.json``-style files and ``config.yaml``: written, fsynced, renamed; the folder fsynced too."""
    import os

    from detr_peg import outputs as atomic
    from detr_peg.config.loader import save_config
    from detr_peg.outputs import write_json

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    write_json(tmp_path / "metrics.json", {"AP": 0.5})
    save_config(load_config(None, []), tmp_path / "config.yaml")
    assert (tmp_path / "metrics.json").read_text() == '{\n "AP": 0.5\n}\n'
    assert load_config(tmp_path / "config.yaml").train.lr == load_config(None, []).train.lr
    if os.path.exists("/proc/self/fd"):
        names = [os.path.basename(p) for p in synced]
        assert names[0].startswith(".metrics.json.tmp-") and names[2].startswith(".config.yaml.tmp-"), names
        assert names[1] == names[3] == tmp_path.name  # the folder, after each rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "metrics.json"]


def test_stale_temporaries_of_every_run_file_are_removed_at_start(tmp_path) -> None:
    from detr_peg.engine.checkpointing import check_output_dir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)  # a process that has ended
    stale = [f".checkpoint.pth.tmp-{pid}", f".metrics.json.tmp-{pid}", f".config.yaml.tmp-{pid}"]
    for name in [*stale, "config.yaml.tmp", "notes.tmp", f".config.yaml.tmp-{os.getpid()}"]:
        (tmp_path / name).write_text("partial")
    check_output_dir(tmp_path, 0)  # the user's files and a live process's temporary stay
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".config.yaml.tmp-{os.getpid()}", "config.yaml.tmp",
                                                                "notes.tmp"])  # fmt: skip


@pytest.mark.parametrize("side, fails", [(16, True), (32, False)])
def test_trainable_batchnorm_over_1x1_maps_is_a_config_error(side: int, fails: bool) -> None:
    """Batch 1 at 16 px gives the stride-16 ResNet-18 stage a 1 x 1 map: torch's BatchNorm raised ValueError."""
    import torch

    from detr_peg.engine.trainer import train_step
    from detr_peg.models import build_criterion, build_model
    from tests.engine.tiny_run import TINY_MODEL

    cfg = load_config(None, [*TINY_MODEL, "model.num_classes=2"])
    model, criterion = build_model(cfg).train(), build_criterion(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    target = {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}
    batch = (torch.zeros(1, 3, side, side), torch.zeros(1, side, side, dtype=torch.bool), [target])
    args = dict(device=torch.device("cpu"), amp="none", scaler=None, clip_max_norm=0.1, iteration=0, epoch=0)
    if not fails:
        assert set(train_step(model, criterion, optimizer, list(model.parameters()), batch, **args)) >= {"loss"}
        return
    with pytest.raises(ConfigError, match=r"^A batch of 1 image\(s\) of 16 x 16 pixels gives feature maps of 1 x 1, "
                       r"too small for the model's normalisation \(Expected more .*\); raise the image sizes"):  # fmt: skip
        train_step(model, criterion, optimizer, list(model.parameters()), batch, **args)


def test_deformable_groupnorm_over_a_1x1_level_is_a_config_error_in_predict() -> None:
    """hidden_dim 32 is one channel per GroupNorm group: a 1 x 1 extra level is one value, which torch refuses."""
    import torch

    from detr_peg import Detector
    from tests.engine.tiny_run import TINY_MODEL

    def detector(side: int) -> Detector:
        levels = ["model.arch=deformable_detr", "model.transformer.num_feature_levels=3", "model.num_classes=2"]
        sizes = [f"data.val_scale={side}", f"data.val_max_size={side}"]
        return Detector.from_config(None, [*TINY_MODEL, *levels, *sizes], device="cpu")

    image = torch.zeros(3, 64, 64, dtype=torch.uint8)
    assert len(detector(128).predict(image, threshold=0.0)) == 8 * 2  # 128 px: the stride-64 level is 2 x 2
    with pytest.raises(ConfigError, match=r"^A batch of 1 image\(s\) of 64 x 64 pixels gives feature maps of 1 x 1, "
                       r"too small .*Deformable-DETR's GroupNorm \(32 groups\) model.transformer.hidden_dim to 64"):  # fmt: skip
        detector(64).predict(image)
