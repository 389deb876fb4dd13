"""Building the official DETR and Deformable-DETR models from a local copy, for comparison.

``detr-peg bench --official PATH`` points at a checkout of
facebookresearch/detr (DETR configs) or fundamentalvision/Deformable-DETR
(Deformable-DETR configs).
Nothing of them is shipped with detr_peg. Each benchmark case runs in its own
process, so their top-level packages (``models``, ``util``) never meet ours.

The official code needs a few runtime patches to run on a current
PyTorch/torchvision without downloads or compiled extensions (the same ones
the parity fixtures were made with):

* ``models.backbone.is_main_process`` returns False, so the ResNet is built
  with ``pretrained=False`` (random init, no download);
* Deformable-DETR: ``torchvision.__version__`` reads ``0.8.2`` while it is
  imported (its ``float(__version__[:3])`` check fails on 0.10+), a stub
  ``MultiScaleDeformableAttention`` module stands in for the compiled op, and
  ``MSDeformAttnFunction`` is replaced by the repository's own pure-PyTorch
  ``ms_deform_attn_core_pytorch`` (its documented CPU path). On a GPU
  (``cuda_op=True``) its compiled op is built on the machine instead, see
  :mod:`detr_peg.benchmark.official_cuda_op`.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
from torch import nn

from detr_peg.benchmark.official_cuda_op import float32_function, install_official_op
from detr_peg.errors import ConfigError

#: A file every checkout of the official repository of each architecture has.
MARKERS = {"detr": "models/detr.py", "deformable_detr": "models/deformable_detr.py"}
REPOSITORIES = {"detr": "facebookresearch/detr", "deformable_detr": "fundamentalvision/Deformable-DETR"}


def check_official_repo(path: str, arch: str) -> None:
    """Raise a :class:`ConfigError` unless ``path`` is a checkout of ``arch``'s official repository."""
    if not (Path(path) / MARKERS[arch]).is_file():
        raise ConfigError(
            f"--official {path} does not look like the official repository of {arch} "
            f"(no {MARKERS[arch]}); point it at a checkout of github.com/{REPOSITORIES[arch]}."
        )


def _import_repo(path: str, arch: str) -> None:
    check_official_repo(path, arch)
    sys.path.insert(0, str(Path(path).resolve()))


def _args(get_args_parser, argv: list[str]):
    return get_args_parser().parse_args(["--device", "cpu", *argv])


def build_official_detr(path: str, argv: list[str]) -> tuple[nn.Module, nn.Module, object]:
    """The official DETR ``(model, criterion, args)`` from ``path`` (argv: their CLI flags)."""
    _import_repo(path, "detr")
    import models.backbone as official_backbone  # type: ignore[import-not-found]

    official_backbone.is_main_process = lambda: False
    from main import get_args_parser  # type: ignore[import-not-found]
    from models import build_model  # type: ignore[import-not-found]

    args = _args(get_args_parser, argv)
    model, criterion, _ = build_model(args)
    return model, criterion, args


def build_official_deformable(
    path: str, argv: list[str], *, cuda_op: bool = False
) -> tuple[nn.Module, nn.Module, object]:
    """The official Deformable-DETR ``(model, criterion, args)``: with its pure-PyTorch attention, or with
    its compiled CUDA op built on this machine (``cuda_op=True``, run in float32 under autocast)."""
    _import_repo(path, "deformable_detr")
    import torchvision

    torchvision.__version__ = "0.8.2"
    if cuda_op:
        install_official_op(path)
    else:
        stub = types.ModuleType("MultiScaleDeformableAttention")

        def _missing(*args, **kwargs):
            raise RuntimeError("the compiled MultiScaleDeformableAttention op is not used in this benchmark")

        stub.ms_deform_attn_forward = stub.ms_deform_attn_backward = _missing
        sys.modules["MultiScaleDeformableAttention"] = stub

    import models.backbone as official_backbone  # type: ignore[import-not-found]
    import models.ops.modules.ms_deform_attn as official_msda  # type: ignore[import-not-found]
    from models.ops.functions.ms_deform_attn_func import ms_deform_attn_core_pytorch  # type: ignore

    class PurePyTorchFunction:
        @staticmethod
        def apply(value, shapes, level_start_index, locations, weights, im2col_step):
            return ms_deform_attn_core_pytorch(value, shapes, locations, weights)

    official_msda.MSDeformAttnFunction = (
        float32_function(official_msda.MSDeformAttnFunction) if cuda_op else PurePyTorchFunction
    )
    official_backbone.is_main_process = lambda: False
    from main import get_args_parser  # type: ignore[import-not-found]
    from models import build_model  # type: ignore[import-not-found]

    args = _args(get_args_parser, argv)
    model, criterion, _ = build_model(args)
    return model, criterion, args


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
