"""``model.backbone.memory_format``: channels_last changes the layout and the rounding, not the function.

A float64 NCHW run is the ground truth: the float32 channels_last features
must be within four times the error of the float32 NCHW ones (random-init
ResNets grow their activations layer by layer, so errors are compared with
the NCHW run's rather than with a fixed tolerance), and both runs' gradients
within 1e-3 relative.
"""

from __future__ import annotations

import copy

import pytest
import torch

from detr_peg.config.schema import BackboneConfig
from detr_peg.models.backbones import build_backbone


def _error(actual: list[torch.Tensor], truth: list[torch.Tensor]) -> float:
    return max((a.double() - t).abs().max().item() for a, t in zip(actual, truth))


@pytest.mark.parametrize(
    "source, name, norm, out_stages",
    [
        ("torchvision", "resnet18", "frozen_bn", [2, 3, 4]),
        ("torchvision", "resnet50", "frozen_bn", [4]),
        ("timm", "resnet18", "frozen_bn", [3, 4]),
    ],
)
def test_channels_last_is_as_accurate_as_contiguous(source, name, norm, out_stages):
    torch.manual_seed(0)
    cfg = BackboneConfig(source=source, name=name, norm=norm, frozen_stages=0)
    nchw = build_backbone(cfg, out_stages)
    nhwc = build_backbone(BackboneConfig(**{**cfg.__dict__, "memory_format": "channels_last"}), out_stages)
    nhwc.load_state_dict(nchw.state_dict())
    truth_model = copy.deepcopy(nchw).double()
    assert (nchw.memory_format, nhwc.memory_format) == (torch.contiguous_format, torch.channels_last)

    images = torch.randn(2, 3, 97, 131)
    truth, a, b = truth_model(images.double()), nchw(images), nhwc(images)
    assert [t.shape for t in a] == [t.shape for t in b] == [t.shape for t in truth]
    assert b[0].is_contiguous(memory_format=torch.channels_last)
    # The convolution weights are kept in the images' layout (no re-ordered copy per call), with the same values.
    kernels = [(k, p) for k, p in nhwc.named_parameters() if p.dim() == 4 and p.shape[-1] > 1]
    assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for _, p in kernels)
    assert not any(p.is_contiguous() for _, p in kernels)
    for key, p in kernels:
        torch.testing.assert_close(p, nchw.state_dict()[key], rtol=0, atol=0)
    assert 0 < _error(b, truth) < 4 * _error(a, truth)

    # Gradients: the relative error of all parameter gradients together stays
    # below 1e-3 for both layouts (channels_last's is a few times NCHW's).
    for _model, out in ((truth_model, truth), (nchw, a), (nhwc, b)):
        sum(t.square().mean() for t in out).backward()
    keys = [k for k, p in nchw.named_parameters() if p.requires_grad]
    assert len(keys) > 10

    def grads(model):
        params = dict(model.named_parameters())
        return torch.cat([params[k].grad.flatten().double() for k in keys])

    exact = grads(truth_model)
    for model in (nchw, nhwc):
        assert (grads(model) - exact).norm() / exact.norm() < 1e-3
