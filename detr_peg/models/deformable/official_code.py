"""The official Deformable-DETR built from a local checkout for ``bench --official``, patched at runtime to need
no download or compiled op: random-init ResNet, ``torchvision.__version__`` read as ``0.8.2`` (its
version check fails on 0.10+), and its pure-PyTorch core, or on a GPU its CUDA op built here.
"""

from __future__ import annotations

import sys
import types

from torch import nn

from detr_peg.models.deformable.official_cuda_op import float32_function, install_official_op
from detr_peg.models.official_checkout import import_checkout, official_args
from detr_peg.models.registry import OfficialCode


def build_official_deformable(path: str, argv: list[str], cuda_op: bool = False) -> tuple[nn.Module, nn.Module, object]:
    """The official ``(model, criterion, args)``: pure-PyTorch attention, or its CUDA op (``cuda_op``, float32)."""
    import_checkout(path, OFFICIAL, "deformable_detr")
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

    args = official_args(get_args_parser, argv)
    model, criterion, _ = build_model(args)
    return model, criterion, args


OFFICIAL = OfficialCode(
    repository="fundamentalvision/Deformable-DETR",
    marker="models/deformable_detr.py",
    build=build_official_deformable,
    gpu_label="official (CUDA op)",
)
