"""Public builders: a model, its criterion and its post-processor from a config."""

from __future__ import annotations

from torch import nn

from detr_peg.config.schema import Config
from detr_peg.models.argument_checks import check_config
from detr_peg.models.criterion import SetCriterion
from detr_peg.models.registry import MODELS, Architecture

# Importing a family registers it in MODELS, with its config fields and defaults (the list of families).
import detr_peg.models.detr  # noqa: E402,F401  isort: skip
import detr_peg.models.deformable  # noqa: E402,F401  isort: skip


def _architecture(cfg: Config) -> Architecture:
    check_config(cfg)
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
