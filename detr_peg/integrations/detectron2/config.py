"""The detectron2 config keys of detr_peg and the detr_peg config they resolve to.

Two configs meet here, each owning its part. The detr_peg YAML describes the
detector (backbone, transformer, positional encoding, matching and loss);
detectron2's ``CfgNode`` describes data, augmentation, solver and runtime. The
only values passed from detectron2 to detr_peg are the number of classes and
the architecture chosen by ``MODEL.META_ARCHITECTURE``.
"""

from __future__ import annotations

from detectron2.config import CfgNode as CN

import detr_peg.models  # noqa: F401  (registers the architectures and encodings the config is checked against)
from detr_peg.config import Config, load_config
from detr_peg.errors import ConfigError
from detr_peg.models.registry import MODELS

#: detectron2 output names of the four backbone stages, as detectron2's ResNet names them.
STAGE_NAMES = {"res2": 1, "res3": 2, "res4": 3, "res5": 4}


def add_detr_peg_config(cfg: CN) -> None:
    """Add the detr_peg keys to a detectron2 config (in place), before ``merge_from_file``.

    Adds:

    * ``MODEL.DETR_PEG.CONFIG_FILE``: a detr_peg YAML file (``configs/...``),
      relative to the working directory or absolute; ``""`` starts from the
      detr_peg defaults of the meta-architecture.
    * ``MODEL.DETR_PEG.OVERRIDES``: detr_peg ``key=value`` overrides applied
      after the file (``["model.position.name=peg"]``).
    * ``MODEL.DETR_PEG.NUM_CLASSES``: object classes; sets detr_peg's
      ``model.num_classes``. detectron2 datasets use contiguous ids
      ``0..NUM_CLASSES-1``.
    * ``MODEL.DETR_PEG.OUT_FEATURES``: outputs of ``DetrPegBackbone`` when it
      serves another detectron2 model (``res2``..``res5``).
    * ``SOLVER.OPTIMIZER`` (``ADAMW``), ``SOLVER.BACKBONE_MULTIPLIER`` (0.1)
      and ``SOLVER.LINEAR_PROJ_MULTIPLIER`` (0.1, Deformable-DETR's
      ``sampling_offsets`` and ``reference_points``): the AdamW learning rate
      of each parameter group relative to ``SOLVER.BASE_LR``.
    * ``INPUT.CROP.RESIZE_SHORTEST_EDGE`` ([400, 500, 600]) and
      ``INPUT.CROP.PROB`` (0.5): DETR's random resize-then-crop branch.

    Existing detectron2 keys keep their defaults; the YAML files in
    ``configs/detectron2/`` set the ones DETR needs (RGB input, ImageNet
    pixel statistics, DETR's resize and crop sizes, gradient clipping).
    """
    cfg.MODEL.DETR_PEG = CN()
    cfg.MODEL.DETR_PEG.CONFIG_FILE = ""
    cfg.MODEL.DETR_PEG.OVERRIDES = []
    cfg.MODEL.DETR_PEG.NUM_CLASSES = 80
    cfg.MODEL.DETR_PEG.OUT_FEATURES = ["res3", "res4", "res5"]

    cfg.SOLVER.OPTIMIZER = "ADAMW"
    cfg.SOLVER.BACKBONE_MULTIPLIER = 0.1
    cfg.SOLVER.LINEAR_PROJ_MULTIPLIER = 0.1

    cfg.INPUT.CROP.RESIZE_SHORTEST_EDGE = [400, 500, 600]
    cfg.INPUT.CROP.PROB = 0.5


def detr_peg_config(cfg: CN, arch: str | None = None) -> Config:
    """The detr_peg :class:`Config` described by ``cfg.MODEL.DETR_PEG``.

    Args:
        cfg: a detectron2 config that went through :func:`add_detr_peg_config`.
        arch: the ``model.arch`` the caller builds (``detr``,
            ``deformable_detr``, ...); ``None`` accepts any.

    Returns:
        The resolved config, with ``model.num_classes`` set from
        ``MODEL.DETR_PEG.NUM_CLASSES``.

    Raises:
        ConfigError: the detr_peg keys are missing, the file or an override is
            invalid, or the file describes another architecture than ``arch``.
    """
    node = cfg.MODEL.get("DETR_PEG")
    if node is None:
        raise ConfigError(
            "cfg.MODEL.DETR_PEG is missing: call detr_peg.integrations.detectron2.add_detr_peg_config(cfg) "
            "before merging a config file."
        )
    path = node.CONFIG_FILE or None
    overrides = [*node.OVERRIDES, f"model.num_classes={node.NUM_CLASSES}"]
    if path is None and arch is not None:
        overrides.insert(0, f"model.arch={arch}")
    config = load_config(path, overrides)
    if arch is not None and config.model.arch != arch:
        names = {a: MODELS.get(a).detectron2_name for a in MODELS.names() if MODELS.get(a).detectron2_name}
        matching = ", ".join(f"{name} for {a}" for a, name in names.items())
        raise ConfigError(
            f"cfg.MODEL.META_ARCHITECTURE {cfg.MODEL.META_ARCHITECTURE!r} builds model.arch {arch!r}, but "
            f"cfg.MODEL.DETR_PEG ({path or 'OVERRIDES'}) describes {config.model.arch!r}; use the matching "
            f"meta-architecture ({matching}) or DetrPegModel, which builds any."
        )
    return config


def out_feature_stages(names: list[str]) -> list[int]:
    """detr_peg stages (1-based) of detectron2 output names ``res2``..``res5``, which must ascend.

    Raises:
        ConfigError: an unknown name, or names out of order.
    """
    unknown = [n for n in names if n not in STAGE_NAMES]
    if unknown or not names:
        raise ConfigError(
            f"cfg.MODEL.DETR_PEG.OUT_FEATURES {list(names)} must name outputs among "
            f"{', '.join(STAGE_NAMES)} (strides 4, 8, 16, 32)."
        )
    stages = [STAGE_NAMES[n] for n in names]
    if stages != sorted(set(stages)):
        raise ConfigError(f"cfg.MODEL.DETR_PEG.OUT_FEATURES {list(names)} must be distinct and by increasing stride.")
    return stages
