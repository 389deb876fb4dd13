"""The official DETR and Deformable-DETR in the benchmark (``--official PATH``): model, optimizer groups, inputs."""

from __future__ import annotations

import torch
from torch import nn

from detr_peg.errors import ConfigError
from detr_peg.models.official_checkout import check_checkout
from detr_peg.models.registry import MODELS, OfficialCode


def official_code(arch: str) -> OfficialCode:
    """The official implementation of ``arch``; ``ConfigError`` when it registers none."""
    official = MODELS.get(arch).official
    if official is None:
        raise ConfigError(f"model.arch {arch} has no official implementation registered; leave out --official.")
    return official


def check_official_repo(path: str, arch: str) -> None:
    """Raise a :class:`ConfigError` unless ``path`` is a checkout of ``arch``'s official repository."""
    check_checkout(path, official_code(arch), arch)


def build_official(
    arch: str, path: str, argv: list[str], *, cuda_op: bool = False
) -> tuple[nn.Module, nn.Module, object]:
    """The official ``(model, criterion, args)`` of ``arch`` from the checkout at ``path``."""
    return official_code(arch).build(path, argv, cuda_op)


def official_param_groups(model: nn.Module, args) -> list[dict]:
    """The official training scripts' AdamW groups (backbone, linear projections, rest)."""
    proj = tuple(getattr(args, "lr_linear_proj_names", ()))
    mult = getattr(args, "lr_linear_proj_mult", 1.0)
    groups = {"rest": [], "backbone": [], "proj": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "backbone.0" in name:
            groups["backbone"].append(p)
        elif proj and any(k in name for k in proj):
            groups["proj"].append(p)
        else:
            groups["rest"].append(p)
    lrs = {"rest": args.lr, "backbone": args.lr_backbone, "proj": args.lr * mult}
    return [{"params": v, "lr": lrs[k]} for k, v in groups.items() if v]


def official_inputs(images: torch.Tensor, mask: torch.Tensor):
    """Wrap a padded batch in the official ``NestedTensor``."""
    from util.misc import NestedTensor  # type: ignore[import-not-found]

    return NestedTensor(images, mask)
