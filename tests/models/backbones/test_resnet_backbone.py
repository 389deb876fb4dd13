"""The torchvision ResNet backbone: stages, shapes, freezing, weights and frozen-BN folding."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torchvision.ops import FrozenBatchNorm2d

from detr_peg.config import BackboneConfig
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.models.backbones import build_backbone


def _randomize_frozen_bn(module: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, FrozenBatchNorm2d):
            n = m.weight.numel()
            m.running_mean.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)


@pytest.mark.parametrize("name, channels", [("resnet18", [128, 256, 512]), ("resnet50", [512, 1024, 2048])])
def test_folded_forward_equals_torchvision_forward(name, channels):
    torch.manual_seed(0)
    backbone = build_backbone(BackboneConfig(name=name), [2, 3, 4]).eval()
    _randomize_frozen_bn(backbone)
    assert backbone.out_channels == channels and backbone.strides == [8, 16, 32]
    x = torch.randn(2, 3, 67, 93)
    with torch.no_grad():
        feats = backbone(x)
        body = backbone.body
        ref = body.maxpool(body.relu(body.bn1(body.conv1(x))))
        expected = []
        for stage in range(1, 5):
            ref = getattr(body, f"layer{stage}")(ref)
            if stage >= 2:
                expected.append(ref)
    for got, want in zip(feats, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_folded_backward_equals_torchvision_backward():
    torch.manual_seed(0)
    backbone = build_backbone(BackboneConfig(name="resnet18"), [4])
    _randomize_frozen_bn(backbone)
    x = torch.randn(1, 3, 64, 64)
    backbone(x)[0].square().sum().backward()
    ours = {n: p.grad.clone() for n, p in backbone.named_parameters() if p.grad is not None}
    backbone.zero_grad()
    body = backbone.body
    y = body.maxpool(body.relu(body.bn1(body.conv1(x))))
    for s in range(1, 5):
        y = getattr(body, f"layer{s}")(y)
    y.square().sum().backward()
    assert set(ours) == {n for n, p in backbone.named_parameters() if p.grad is not None}
    for n, p in backbone.named_parameters():
        if n in ours:
            torch.testing.assert_close(ours[n], p.grad, rtol=1e-4, atol=1e-4, msg=n)


def test_stages_after_the_last_requested_are_not_built():
    backbone = build_backbone(BackboneConfig(name="resnet18", norm="bn", frozen_stages=0), [2, 3])
    assert not hasattr(backbone.body, "layer4") and not hasattr(backbone.body, "fc")
    assert backbone.strides == [8, 16] and backbone.out_channels == [128, 256]
    assert [f.shape[-2:] for f in backbone(torch.randn(1, 3, 64, 96))] == [(8, 12), (4, 6)]
    assert all(p.requires_grad for p in backbone.parameters())
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in backbone.modules())


def test_dilation_keeps_stride_16():
    backbone = build_backbone(BackboneConfig(name="resnet50", dilation=True), [4])
    assert backbone.strides == [16]
    assert backbone(torch.randn(1, 3, 64, 64))[0].shape[-2:] == (4, 4)


@pytest.mark.parametrize(
    "frozen, train, trainable",
    [
        (1, True, {"layer2", "layer3", "layer4"}),
        (0, True, {"conv1", "bn1", "layer1", "layer2", "layer3", "layer4"}),
        (3, True, {"layer4"}),
        (1, False, set()),
    ],
)
def test_frozen_stages(frozen, train, trainable):
    backbone = build_backbone(BackboneConfig(name="resnet18", norm="bn", frozen_stages=frozen, train=train), [4])
    got = {n.split(".")[1] for n, p in backbone.named_parameters() if p.requires_grad}
    assert got == trainable


@pytest.mark.parametrize("frozen", [5, 100])
def test_more_frozen_stages_than_the_resnet_has_are_refused(frozen):
    with pytest.raises(
        ConfigError, match=rf"^model.backbone.frozen_stages={frozen}: resnet18 has 4 stages \(4 freezes"
    ):
        build_backbone(BackboneConfig(name="resnet18", norm="bn", frozen_stages=frozen), [4])


def test_local_weights_load_and_mismatches_are_clear(tmp_path):
    torch.manual_seed(3)
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), tmp_path / "r18.pth")  # includes fc.*, ignored
    backbone = build_backbone(BackboneConfig(name="resnet18", weights=str(tmp_path / "r18.pth")), [4])
    for key, value in backbone.body.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[key], msg=key)
    with pytest.raises(CheckpointError, match="do not fit the backbone"):
        build_backbone(BackboneConfig(name="resnet50", weights=str(tmp_path / "r18.pth")), [4])
    with pytest.raises(CheckpointError, match="does not exist"):
        build_backbone(BackboneConfig(name="resnet18", weights=str(tmp_path / "missing.pth")), [4])


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "_orig_mod.module."])
def test_weights_saved_through_a_wrapper_load_as_the_model_s(tmp_path, prefix: str) -> None:
    """DDP's ``module.`` and torch.compile's ``_orig_mod.`` before every key: backbone weights and detr_peg
    checkpoints read as the bare model's."""
    from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
    from detr_peg.config import load_config
    from detr_peg.models import build_model
    from detr_peg.models.loading import model_from_checkpoint
    from tests.engine.tiny_run import TINY_MODEL

    torch.manual_seed(3)
    reference = torchvision.models.resnet18()
    torch.save({prefix + k: v for k, v in reference.state_dict().items()}, tmp_path / "r18.pth")
    backbone = build_backbone(BackboneConfig(name="resnet18", weights=str(tmp_path / "r18.pth")), [4])
    for key, value in backbone.body.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[key], msg=key)
    cfg = load_config(None, [*TINY_MODEL, "model.num_classes=3"])
    model = build_model(cfg)
    save_checkpoint(tmp_path / "c.pth", cfg, {prefix + k: v for k, v in model.state_dict().items()})
    loaded = model_from_checkpoint(read_checkpoint(tmp_path / "c.pth"), cfg).model
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, msg=key)


def test_unknown_torchvision_name_is_a_clear_error():
    with pytest.raises(ConfigError, match="Unknown torchvision backbone 'vgg16'.*resnet50.*source=timm"):
        build_backbone(BackboneConfig(name="vgg16"), [4])


@pytest.mark.parametrize("name", ["resnet18", "resnet34"])
def test_dilation_of_a_basic_block_resnet_is_a_clear_error(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^model.backbone.dilation=true needs a bottleneck ResNet .*'{name}'\.$"):
        build_backbone(BackboneConfig(name=name, dilation=True), [4])


@pytest.mark.parametrize("train, frozen_stages", [(False, 0), (True, 2)])
def test_a_frozen_batchnorm_keeps_its_running_statistics(train: bool, frozen_stages: int) -> None:
    """``norm: bn`` with frozen weights: ``model.train()`` left BatchNorm updating its statistics in training."""
    cfg = BackboneConfig(name="resnet18", norm="bn", train=train, frozen_stages=frozen_stages)
    backbone = build_backbone(cfg, [3])
    container = torch.nn.Sequential(backbone).train()  # as a detector's train() reaches its backbone
    before = {k: v.clone() for k, v in backbone.state_dict().items() if "running_" in k}
    container(torch.randn(2, 3, 64, 64))
    after = backbone.state_dict()
    for key, value in before.items():
        stage = key.split(".")[1]  # conv1/bn1 (the stem) or layerN
        frozen = not train or stage == "bn1" or int(stage.removeprefix("layer")) <= frozen_stages
        if frozen:
            torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)
        else:
            assert not torch.equal(after[key], value), key
