"""detectron2 integration: DETR-PEG and Deformable-DETR-PEG as detectron2 models.

Importing this package registers, in detectron2's registries:

* ``build_detr_peg_backbone`` in ``BACKBONE_REGISTRY`` (``MODEL.BACKBONE.NAME``),
  building :class:`DetrPegBackbone`: any detr_peg backbone
  (torchvision ResNet or timm model) as a detectron2 ``Backbone`` with outputs
  ``res2``..``res5`` (strides 4..32);
* ``DetrPegModel`` (any architecture, from the detr_peg config) and one
  meta-architecture per architecture registration that names one
  (``DetrPeg``, ``DeformableDetrPeg``) in ``META_ARCH_REGISTRY``: the detr_peg
  detectors, taking detectron2's ``batched_inputs`` and returning losses
  (training) or ``[{"instances": Instances}]`` (inference).

Usage::

    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    from detr_peg.integrations.detectron2 import add_detr_peg_config

    cfg = get_cfg()
    add_detr_peg_config(cfg)
    cfg.merge_from_file("configs/detectron2/detr_r50_peg_coco.yaml")
    model = build_model(cfg)

The detector itself (backbone, transformer, positional encoding, loss) is
described by a detr_peg config (``cfg.MODEL.DETR_PEG.CONFIG_FILE`` plus
``OVERRIDES``); detectron2's config describes data, solver and runtime.
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
