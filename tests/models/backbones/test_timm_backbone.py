"""The timm backbone: levels by stride, norm handling, frozen stages, weights, errors.

Small timm models keep this fast on a CPU: ``resnet18`` (BatchNorm),
``convnext_atto`` (LayerNorm) and ``twins_pcpvt_small`` (LayerNorm, PEG inside).
No test needs network: weights are random or written to ``tmp_path``.
"""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from detr_peg.config.schema import BackboneConfig
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.models.backbones import build_backbone
from detr_peg.models.backbones import timm_backbone as timm_module

MODELS = ["resnet18", "convnext_atto", "twins_pcpvt_small"]


def timm_backbone(name: str, out_stages: list[int], **fields):
    torch.manual_seed(0)
    fields.setdefault("norm", "bn")
    fields.setdefault("frozen_stages", 0)
    return build_backbone(BackboneConfig(source="timm", name=name, **fields), out_stages)


def image_batch() -> torch.Tensor:
    return torch.randn(2, 3, 70, 90, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------ levels


@pytest.fixture(scope="module", params=MODELS)
def reference(request):
    """``(name, timm features model with every level)``, built once per model."""
    return request.param, timm.create_model(request.param, features_only=True).eval()


@pytest.mark.parametrize("out_stages", [[4], [1, 2, 3, 4]])
def test_levels_are_chosen_by_stride_and_match_timm(reference, out_stages):
    name, model = reference
    backbone = timm_backbone(name, out_stages).eval()
    model.load_state_dict(backbone.body.state_dict(), strict=False)  # the body may stop early
    info = model.feature_info
    wanted = [2 ** (s + 1) for s in out_stages]
    assert backbone.strides == wanted
    assert backbone.out_channels == [info.channels()[info.reduction().index(r)] for r in wanted]
    x = image_batch()
    with torch.no_grad():
        outs = backbone(x)
        ref = dict(zip(info.reduction(), model(x)))
    assert len(outs) == len(out_stages)
    torch.testing.assert_close(outs, [ref[r] for r in wanted])


@pytest.mark.parametrize("name", MODELS)
def test_unused_stages_are_not_built(name):
    """Every parameter of a backbone cut after stage 2 gets a gradient (DDP needs no unused parameters)."""
    backbone = timm_backbone(name, [2])
    (out,) = backbone(image_batch())
    out.sum().backward()
    unused = [n for n, p in backbone.named_parameters() if p.grad is None]
    assert unused == []
    assert sum(p.numel() for p in backbone.parameters()) < sum(p.numel() for p in timm_backbone(name, [4]).parameters())


# -------------------------------------------------------------------- norm


def test_frozen_bn_replaces_every_batchnorm_and_equals_bn_in_eval():
    trainable_bn = timm_backbone("resnet18", [2, 3, 4], norm="bn").eval()
    frozen = timm_backbone("resnet18", [2, 3, 4], norm="frozen_bn")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in frozen.modules())
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in frozen.modules()) == sum(
        isinstance(m, nn.BatchNorm2d) for m in trainable_bn.modules()
    )
    # BatchNorm statistics and affine terms are buffers now: no parameter of a norm layer remains.
    assert all("bn" not in name for name, _ in frozen.named_parameters())
    with torch.no_grad():
        for module in trainable_bn.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    frozen.load_state_dict(trainable_bn.state_dict(), strict=False)  # frozen BN has no num_batches_tracked
    x = image_batch()
    with torch.no_grad():
        torch.testing.assert_close(frozen.train()(x), trainable_bn(x))  # frozen BN ignores train mode


def test_frozen_bn_keeps_eps_inside_the_rsqrt():
    frozen = timm_backbone("resnet18", [4], norm="frozen_bn")
    norm = next(m for m in frozen.modules() if isinstance(m, FrozenBatchNorm2d))
    assert norm.eps == 1e-5
    with torch.no_grad():
        norm.running_var.zero_()  # only eps keeps the scale finite
        norm.weight.uniform_(0.5, 2)
    x = torch.randn(1, norm.num_features, 2, 2)
    scale = norm.weight / torch.tensor(1e-5).sqrt()
    expected = x * scale.view(1, -1, 1, 1) + (norm.bias - norm.running_mean * scale).view(1, -1, 1, 1)
    torch.testing.assert_close(norm(x), expected)
    assert torch.isfinite(norm.half()(x.half())).all()  # eps outside the rsqrt gives inf in fp16


def test_bn_and_sync_bn_stay_trainable():
    bn = timm_backbone("resnet18", [4], norm="bn")
    assert bn.body.bn1.weight.requires_grad and isinstance(bn.body.bn1, nn.BatchNorm2d)
    sync = timm_backbone("resnet18", [4], norm="sync_bn")
    assert isinstance(sync.body.bn1, nn.SyncBatchNorm)


def test_frozen_bn_leaves_layernorm_models_unchanged():
    name = "convnext_atto"
    frozen = timm_backbone(name, [4], norm="frozen_bn")
    plain = timm_backbone(name, [4], norm="bn")
    assert [type(m) for m in frozen.modules()] == [type(m) for m in plain.modules()]
    norms = [m for m in frozen.modules() if isinstance(m, nn.LayerNorm)]
    assert norms and all(p.requires_grad for m in norms for p in m.parameters())


# ----------------------------------------------------------- frozen stages


@pytest.mark.parametrize(
    "name,frozen_stages",
    [
        ("resnet18", 0),
        ("resnet18", 1),
        ("resnet18", 2),
        ("resnet18", 3),
        ("convnext_atto", 1),
        ("convnext_atto", 3),
    ],
)
def test_frozen_stages_cut_the_gradient_after_stage_n(name, frozen_stages):
    backbone = timm_backbone(name, [1, 2, 3, 4], frozen_stages=frozen_stages)
    outs = backbone(image_batch())
    assert [o.requires_grad for o in outs] == [stage > frozen_stages for stage in (1, 2, 3, 4)]


def test_more_frozen_stages_than_the_model_has_are_refused():
    """The model's stages count, not the ones built: stage 3 of a backbone cut after stage 2 may be frozen."""
    with pytest.raises(ConfigError, match=r"^model.backbone.frozen_stages=5: convnext_atto has 4 stages \(4 freezes"):
        timm_backbone("convnext_atto", [1, 2], frozen_stages=5)
    backbone = timm_backbone("resnet18", [2], frozen_stages=3)
    assert not any(p.requires_grad for p in backbone.parameters())


def test_frozen_stages_resnet_names():
    backbone = timm_backbone("resnet18", [2, 3, 4], frozen_stages=1)
    trainable = {n.split(".")[1] for n, p in backbone.named_parameters() if p.requires_grad}
    frozen = {n.split(".")[1] for n, p in backbone.named_parameters() if not p.requires_grad}
    assert frozen == {"conv1", "bn1", "layer1"}
    assert trainable == {"layer2", "layer3", "layer4"}


def test_frozen_stages_twins_finds_the_stage_one_peg():
    """Twins keeps patch embeddings, blocks and PEGs in separate lists; all three stage-1 parts freeze."""
    backbone = timm_backbone("twins_pcpvt_small", [1, 2, 3, 4], frozen_stages=1)
    frozen = {".".join(n.split(".")[2:4]) for n, p in backbone.named_parameters() if not p.requires_grad}
    assert frozen == {"patch_embeds.0", "blocks.0", "pos_block.0"}
    assert backbone.body.model.pos_block[1].proj[0].weight.requires_grad
    outs = backbone(image_batch())
    assert [o.requires_grad for o in outs] == [False, True, True, True]


def test_frozen_stages_fall_back_to_a_cpu_probe(monkeypatch):
    """An operation without a meta-device kernel makes the dependency probe run on the CPU."""
    real = timm_module.dependent_parameters
    devices = []

    def probe(model, level):
        device = next(model.parameters()).device
        devices.append(device.type)
        if device.type == "meta":
            raise NotImplementedError("no meta kernel")
        return real(model, level)

    monkeypatch.setattr(timm_module, "dependent_parameters", probe)
    backbone = timm_backbone("resnet18", [2, 3, 4], frozen_stages=1)
    assert devices == ["meta", "cpu"]
    assert {n.split(".")[1] for n, p in backbone.named_parameters() if not p.requires_grad} == {
        "conv1",
        "bn1",
        "layer1",
    }


@pytest.mark.parametrize("fields", [dict(train=False), dict(frozen_stages=4)])  # 5 and more: refused (above)
def test_everything_frozen(fields):
    backbone = timm_backbone("convnext_atto", [2, 3, 4], **fields)
    assert not any(p.requires_grad for p in backbone.parameters())


# ----------------------------------------------------------------- weights


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
@pytest.mark.parametrize("name", ["resnet18", "convnext_atto"])
def test_whole_model_timm_state_dict_loads(tmp_path, name, suffix):
    torch.manual_seed(3)
    full = timm.create_model(name).eval()
    path = tmp_path / f"{name}{suffix}"
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in full.state_dict().items()}, str(path))
    else:
        torch.save(full.state_dict(), path)
    backbone = timm_backbone(name, [4], weights=str(path)).eval()
    x = image_batch()
    with torch.no_grad():
        torch.testing.assert_close(backbone(x)[0], full.forward_features(x))


@pytest.mark.parametrize("name", ["resnet18", "twins_pcpvt_small"])
def test_detr_peg_checkpoint_layout_round_trip(tmp_path, name):
    source = timm_backbone(name, [2, 3, 4])
    path = tmp_path / "detector.pth"
    detector = {f"backbone.{k}": v for k, v in source.state_dict().items()}
    detector["transformer.linear.weight"] = torch.zeros(2, 2)  # the rest of the detector is ignored
    torch.save({"format": "detr_peg", "model": detector}, path)
    torch.manual_seed(5)
    loaded = timm_backbone(name, [2, 3, 4], weights=str(path))
    torch.testing.assert_close(loaded.state_dict(), source.state_dict())
    if name == "resnet18":
        shorter = timm_backbone(name, [3], weights=str(path))  # stages that are not built are skipped
        torch.testing.assert_close(
            shorter.state_dict(), {k: v for k, v in source.state_dict().items() if k in shorter.state_dict()}
        )


def test_weights_of_another_model_are_refused(tmp_path):
    path = tmp_path / "resnet34.pth"
    torch.save(timm.create_model("resnet34").state_dict(), path)
    with pytest.raises(CheckpointError, match="fit neither timm model 'resnet18'"):
        timm_backbone("resnet18", [4], weights=str(path))


def test_pretrained_without_network_says_what_to_do(monkeypatch):
    real = timm.create_model

    def offline(name, pretrained=False, **kwargs):
        if pretrained:
            raise OSError("Name or service not known")
        return real(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(CheckpointError, match="set model.backbone.weights to a local weights file"):
        timm_backbone("resnet18", [4], weights="pretrained")


# ------------------------------------------------------------------ errors


def test_unknown_name_gives_a_hint():
    with pytest.raises(ConfigError, match=r"timm.list_models\('\*convnext\*'\).*convnext_tiny"):
        timm_backbone("convnxt_tiny", [4])


def test_model_without_the_stride_lists_its_strides():
    with pytest.raises(ConfigError, match=r"stride-32 .* feature strides \[16\]"):
        timm_backbone("vit_tiny_patch16_224", [4])


@pytest.mark.parametrize(
    "name", ["vit_tiny_patch16_224", "mixer_s16_224", "swin_tiny_patch4_window7_224", "levit_128s"]
)
def test_a_model_of_one_input_size_is_refused_when_built(name):
    """Detection feeds images of every size: a model made for one is refused before training, not at its first batch."""
    stages = [3] if name in ("vit_tiny_patch16_224", "mixer_s16_224") else [4]
    with pytest.raises(ConfigError, match=rf"^timm model '{name}' does not accept a 64x96 image \(.+\); detection"):
        timm_backbone(name, stages)


@pytest.mark.parametrize(
    "fields,stages,match",
    [
        (dict(dilation=True), [4], "dilation"),
        (dict(), [3, 2], "ascending"),
        (dict(), [5], "ascending"),
    ],
)
def test_invalid_settings(fields, stages, match):
    with pytest.raises(ConfigError, match=match):
        timm_backbone("resnet18", stages, **fields)


def test_channels_last_output_is_permuted():
    class ChannelsLast(nn.Module):
        def forward(self, x):
            return [x.permute(0, 2, 3, 1)]

    backbone = timm_module.TimmBackbone(body=ChannelsLast(), out_channels=[3], strides=[1], channels_last=True)
    x = image_batch()
    torch.testing.assert_close(backbone(x), [x])


def test_a_missing_or_broken_timm_is_one_sentence_naming_the_install(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(
        ConfigError, match=r"^model.backbone.source=timm needs the timm package \(.*\): pip install timm\.$"
    ):
        build_backbone(BackboneConfig(source="timm", name="resnet18", weights=None), [4])
