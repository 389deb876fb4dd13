"""Public builders: a model, its criterion and its post-processor from a config."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from detr_peg.config.loader import checked_config
from detr_peg.config.schema import Config, ModelConfig
from detr_peg.errors import ConfigError
from detr_peg.models.criterion import SetCriterion
from detr_peg.models.registry import MODELS, Architecture

# Importing a family registers it in MODELS, with its config fields and defaults (the list of families).
import detr_peg.models.detr  # noqa: E402,F401  isort: skip
import detr_peg.models.deformable  # noqa: E402,F401  isort: skip


def _architecture(cfg: Config | ModelConfig, whole: str | None = None) -> tuple[Any, Architecture]:
    """``cfg`` (a Config validated again: the user may have edited it) and its architecture; ``whole``: the caller
    needs the whole Config, whose section it names."""
    if whole and isinstance(cfg, ModelConfig):
        raise TypeError(
            f"cfg must be the whole detr_peg Config (this builder reads cfg.{whole}), not its model section."
        )
    cfg = checked_config(cfg) if isinstance(cfg, Config) else cfg
    model = cfg.model if isinstance(cfg, Config) else cfg
    if not isinstance(model, ModelConfig):
        raise TypeError(f"cfg must be a detr_peg Config (detr_peg.load_config(...)), got {type(cfg).__name__}")
    return cfg, MODELS.get(model.arch)


#: Held by what changes torch's process-wide state (a training run seeds the global generator, loading a checkpoint
#: forks it, both set the default dtype): such calls in threads of one process take turns.
TORCH_STATE = threading.RLock()


@contextlib.contextmanager
def float32_default() -> Iterator[None]:
    """The block runs with float32 as torch's default dtype, whatever the caller set: the detectors compute in it."""
    previous = torch.get_default_dtype()
    if previous == torch.float32:  # the common case leaves the process-wide setting alone
        yield
        return
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


#: Set in a process forked from this one, whose OpenMP threads stayed in the parent.
_FORKED: list[bool] = []
os.register_at_fork(after_in_child=lambda: _FORKED.append(True))


@contextlib.contextmanager
def torch_defaults() -> Iterator[None]:
    """float32 and the CPU as torch's defaults whatever the caller set (a global float64, a meta or CUDA device):
    the detectors compute in float32 and name the devices they move tensors to. In a forked child torch runs on one
    thread, as in DataLoader workers: its first parallel op would otherwise wait forever for the parent's pool."""
    if _FORKED and torch.get_num_threads() > 1:
        torch.set_num_threads(1)
    elsewhere = torch.empty(0).device.type != "cpu"  # the device mode costs every torch call: only when needed
    with float32_default(), torch.device("cpu") if elsewhere else contextlib.nullcontext():
        yield


def build_model(cfg: Config | ModelConfig) -> nn.Module:
    """The detector of a config's ``model`` section (random init, or backbone weights if configured), in float32."""
    cfg, architecture = _architecture(cfg)
    model_cfg = cfg.model if isinstance(cfg, Config) else cfg
    with float32_default():
        model = architecture.build_model(model_cfg)
    if not isinstance(model, nn.Module):  # a user's architecture, named here rather than deep inside
        raise ConfigError(f"The model architecture {model_cfg.arch!r} built {type(model).__name__}, not an nn.Module.")
    return model


def check_buildable(cfg: Config) -> None:
    """:func:`build_model`'s checks on the meta device (no memory, no weights read, one class if the data gives
    them) and :func:`build_criterion`'s."""
    model = dataclasses.replace(cfg.model, num_classes=cfg.model.num_classes or 1,
                                backbone=dataclasses.replace(cfg.model.backbone, weights=None))  # fmt: skip
    with torch.device("meta"):
        build_model(model)
    build_criterion(dataclasses.replace(cfg, model=model))  # the loss's settings (no tensors)


def build_criterion(cfg: Config) -> SetCriterion:
    """Build the matching loss for ``cfg``."""
    cfg, architecture = _architecture(cfg, whole="loss")
    return architecture.build_criterion(cfg)


def build_postprocessor(cfg: Config) -> nn.Module:
    """Build the post-processor (outputs + original sizes -> scored pixel boxes)."""
    cfg, architecture = _architecture(cfg, whole="eval")
    return architecture.build_postprocessor(cfg)
