"""Training and evaluation: plain functions over a model, its criterion and data."""

from detr_peg.engine.param_groups import build_param_groups

__all__ = ["build_param_groups"]
