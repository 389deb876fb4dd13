"""Public builders: a model, its criterion and its post-processor from a config."""

from __future__ import annotations

from torch import nn

from detr_peg.config.schema import Config
from detr_peg.models.criterion import SetCriterion
from detr_peg.models.registry import MODELS, Architecture


def _architecture(cfg: Config) -> Architecture:
    import detr_peg.models.detr  # noqa: F401  (registers "detr")

    try:
        import detr_peg.models.deformable.build  # noqa: F401  (registers "deformable_detr")
    except ModuleNotFoundError as exc:  # the deformable family is optional while being built
        if "detr_peg.models.deformable.build" not in str(exc):
            raise
    return MODELS.get(cfg.model.arch)


def build_model(cfg: Config) -> nn.Module:
    """Build the detector described by ``cfg.model`` (random init, or backbone weights if configured)."""
    return _architecture(cfg).build_model(cfg)


def build_criterion(cfg: Config) -> SetCriterion:
    """Build the matching loss for ``cfg``."""
    return _architecture(cfg).build_criterion(cfg)


def build_postprocessor(cfg: Config) -> nn.Module:
    """Build the post-processor (outputs + original sizes -> scored pixel boxes)."""
    return _architecture(cfg).build_postprocessor(cfg)
