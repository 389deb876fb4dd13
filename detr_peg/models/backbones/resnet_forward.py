"""A torchvision ResNet forward with frozen BatchNorm applied in place on each convolution's output (bit-identical,
no extra activation-sized allocations), or with ``fold=True`` folded into the weights (equal to float
rounding). Module structure and state-dict keys are torchvision's.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.ops import FrozenBatchNorm2d


def conv_norm(conv: nn.Conv2d, norm: nn.Module, x: Tensor, fold: bool = False) -> Tensor:
    """``norm(conv(x))``; for a frozen norm in place, or folded into the weights with ``fold``."""
    if not isinstance(norm, FrozenBatchNorm2d):
        return norm(conv(x))
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    bias = norm.bias - norm.running_mean * scale
    if fold and conv.bias is None:
        return conv._conv_forward(x, conv.weight * scale.view(-1, 1, 1, 1), bias)
    return conv(x).mul_(scale.view(1, -1, 1, 1)).add_(bias.view(1, -1, 1, 1))


def _downsample(block: nn.Module, x: Tensor, fold: bool) -> Tensor:
    down = block.downsample
    if down is None:
        return x
    if isinstance(down, nn.Sequential) and len(down) == 2 and isinstance(down[0], nn.Conv2d):
        return conv_norm(down[0], down[1], x, fold)
    return down(x)


def block_forward(block: nn.Module, x: Tensor, fold: bool = False) -> Tensor:
    """The forward of a torchvision ``BasicBlock``/``Bottleneck``, residual sum in place."""
    if isinstance(block, Bottleneck):
        out = F.relu(conv_norm(block.conv1, block.bn1, x, fold), inplace=True)
        out = F.relu(conv_norm(block.conv2, block.bn2, out, fold), inplace=True)
        out = conv_norm(block.conv3, block.bn3, out, fold)
    elif isinstance(block, BasicBlock):
        out = F.relu(conv_norm(block.conv1, block.bn1, x, fold), inplace=True)
        out = conv_norm(block.conv2, block.bn2, out, fold)
    else:
        return block(x)
    return F.relu(out.add_(_downsample(block, x, fold)), inplace=True)


def stem_forward(body: nn.Module, x: Tensor, fold: bool = False) -> Tensor:
    """``maxpool(relu(bn1(conv1(x))))``."""
    return body.maxpool(F.relu(conv_norm(body.conv1, body.bn1, x, fold), inplace=True))


def stage_forward(stage: nn.Sequential, x: Tensor, fold: bool = False) -> Tensor:
    """Run every block of a ResNet stage."""
    for block in stage:
        x = block_forward(block, x, fold)
    return x
