"""The official DETR (facebookresearch/detr) built from a local checkout for ``bench --official``, its ResNet
built with random init (no download).
"""

from __future__ import annotations

from torch import nn

from detr_peg.models.official_checkout import import_checkout, official_args
from detr_peg.models.registry import OfficialCode


def build_official_detr(path: str, argv: list[str], cuda_op: bool = False) -> tuple[nn.Module, nn.Module, object]:
    """The official DETR ``(model, criterion, args)`` from ``path`` (argv: their CLI flags; DETR has no compiled op)."""
    import_checkout(path, OFFICIAL, "detr")
    import models.backbone as official_backbone  # type: ignore[import-not-found]

    official_backbone.is_main_process = lambda: False
    from main import get_args_parser  # type: ignore[import-not-found]
    from models import build_model  # type: ignore[import-not-found]

    args = official_args(get_args_parser, argv)
    model, criterion, _ = build_model(args)
    return model, criterion, args


OFFICIAL = OfficialCode(repository="facebookresearch/detr", marker="models/detr.py", build=build_official_detr)
