"""detr_peg's detectron2 config keys; only the class count and the architecture pass from detectron2 to detr_peg."""

from __future__ import annotations

from detectron2.config import CfgNode as CN

import detr_peg.models  # noqa: F401  (registers the architectures and encodings the config is checked against)
from detr_peg.config import Config, load_config
from detr_peg.errors import ConfigError
from detr_peg.models.registry import MODELS

#: detectron2 output names of the four backbone stages, as detectron2's ResNet names them.
STAGE_NAMES = {"res2": 1, "res3": 2, "res4": 3, "res5": 4}


def add_detr_peg_config(cfg: CN) -> None:
    """Add, in place and before ``merge_from_file``, the detr_peg keys to a detectron2 config.

    ``MODEL.DETR_PEG.{CONFIG_FILE, OVERRIDES, NUM_CLASSES, OUT_FEATURES}``, ``SOLVER.{OPTIMIZER,
    BACKBONE_MULTIPLIER, LINEAR_PROJ_MULTIPLIER}`` and ``INPUT.CROP.{RESIZE_SHORTEST_EDGE, PROB}``.
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
    """The detr_peg config of ``cfg.MODEL.DETR_PEG`` (``model.num_classes`` from ``NUM_CLASSES``).

    Raises ``ConfigError``: keys missing, invalid file or override, or an architecture other than ``arch``.
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
    """1-based detr_peg stages of ``res2``..``res5`` names; ``ConfigError`` for unknown or unordered names."""
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
