"""detectron2 integration: importing it registers the ``build_detr_peg_backbone`` backbone and the meta-architectures.

Usage: ``add_detr_peg_config(cfg)``, then ``cfg.merge_from_file("configs/detectron2/detr_r50_peg_coco.yaml")``
and ``build_model(cfg)``; the detector is described by ``cfg.MODEL.DETR_PEG.CONFIG_FILE`` plus ``OVERRIDES``.
"""

try:
    import detectron2  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "detectron2":
        raise
    raise ImportError(
        "detr_peg.integrations.detectron2 needs detectron2, which is not installed and is not on PyPI: "
        "install it as described at https://detectron2.readthedocs.io/en/latest/tutorials/install.html "
        "(for example: pip install 'git+https://github.com/facebookresearch/detectron2.git')."
    ) from None

from detr_peg.integrations.detectron2.backbone import DetrPegBackbone, build_detr_peg_backbone
from detr_peg.integrations.detectron2.config import add_detr_peg_config, detr_peg_config
from detr_peg.integrations.detectron2.mapper import DetrPegDatasetMapper
from detr_peg.integrations.detectron2.meta_arch import DeformableDetrPeg, DetrPeg, DetrPegModel
from detr_peg.integrations.detectron2.solver import build_detr_peg_optimizer

__all__ = [
    "DeformableDetrPeg",
    "DetrPeg",
    "DetrPegBackbone",
    "DetrPegModel",
    "DetrPegDatasetMapper",
    "add_detr_peg_config",
    "build_detr_peg_backbone",
    "build_detr_peg_optimizer",
    "detr_peg_config",
]
