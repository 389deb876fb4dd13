"""Set-up steps shared by training and evaluation runs.

Small functions the runner composes: the number of classes from the data,
deterministic settings, building the model for a run, comparing a config with
the one stored in a checkpoint, and running a step in the main process only
while every process learns whether it failed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from detr_peg.config.loader import config_to_dict
from detr_peg.config.schema import Config
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.distributed import DistEnv, broadcast_object
from detr_peg.errors import ConfigError, TrainingError, UserError
from detr_peg.fileio.atomic import atomic_write_text
from detr_peg.models.position.peg import PEG

T = TypeVar("T")


def resolve_num_classes(cfg: Config, label_map: LabelMap, source: str) -> Config:
    """``cfg`` with ``model.num_classes`` taken from the label map when unset.

    Args:
        cfg: the run's config.
        label_map: the dataset's (or checkpoint's) label map.
        source: the annotation file, for messages.

    Raises:
        ConfigError: ``model.num_classes`` is set but smaller than the labels
            of the data need.
    """
    needed = label_map.num_classes
    given = cfg.model.num_classes
    if given is None:
        return replace(cfg, model=replace(cfg.model, num_classes=needed))
    if given < needed:
        kind = "contiguous labels" if label_map.contiguous else "labels equal to the category ids"
        raise ConfigError(
            f"model.num_classes is {given} but {source} needs {needed} ({len(label_map)} categories, {kind}); "
            "remove model.num_classes to take it from the data."
        )
    return cfg


@contextlib.contextmanager
def determinism(cfg: Config, device: torch.device) -> Iterator[None]:
    """``train.deterministic``: deterministic kernels (a warning where none exists), no cuDNN autotuning.

    The process-wide settings are restored on exit, so a run called from
    Python leaves the caller's settings as they were.
    """
    if not cfg.train.deterministic:
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    if device.type == "cuda":
        # cuBLAS needs this before its first use to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.benchmark = previous[2]


def wrap_sync_batchnorm(model: nn.Module, cfg: Config, env: DistEnv) -> nn.Module:
    """Convert BatchNorm layers to ``SyncBatchNorm`` when ``model.backbone.norm=sync_bn`` runs on several processes.

    The PEG's BatchNorm is left as it is: the PEG computes its statistics over
    valid (unpadded) tokens only with its own masked update
    (:func:`~detr_peg.models.position.peg.masked_batch_norm`), which
    ``SyncBatchNorm`` would not follow, so each process keeps the statistics
    of its own batch there (as with ``model.backbone.norm=bn``).
    """
    if cfg.model.backbone.norm == "sync_bn" and env.distributed:
        return _convert_except_peg(model)
    return model


def _convert_except_peg(module: nn.Module) -> nn.Module:
    if isinstance(module, (PEG, nn.SyncBatchNorm)):  # the PEG's masked statistics; already synchronised
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in module.named_children():
        converted = _convert_except_peg(child)
        if converted is not child:
            setattr(module, name, converted)
    return module


def config_differences(cfg: Config, stored: Config, sections: tuple[str, ...] = ("model", "loss", "data")) -> list[str]:
    """Dotted keys whose values differ between two configs, within ``sections``.

    ``model.backbone.weights`` is ignored (a checkpoint holds the weights).
    """
    a, b = config_to_dict(cfg), config_to_dict(stored)
    out: list[str] = []

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in x:
                walk(x[key], y.get(key), f"{prefix}.{key}" if prefix else key)
        elif x != y and prefix != "model.backbone.weights":
            out.append(prefix)

    for section in sections:
        walk(a[section], b[section], section)
    return out


def on_main(env: DistEnv, step: Callable[[], T]) -> T | None:
    """Run ``step`` in the main process; if it raises a user error, raise it in every process.

    Without this, a failure of the main process (an unwritable folder, a
    full disk) would leave the other processes waiting in their next
    collective operation.

    Returns:
        ``step()``'s value in the main process, None elsewhere.
    """
    result: T | None = None
    message: str | None = None
    error: UserError | None = None
    if env.is_main:
        try:
            result = step()
        except UserError as exc:
            error, message = exc, str(exc)
    if env.distributed:
        message = broadcast_object(message)
    if error is not None:
        raise error
    if message is not None:
        raise TrainingError(f"The main process stopped: {message}")
    return result


def write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON atomically (see :func:`~detr_peg.fileio.atomic_write`); ``indent=None`` writes it
    compactly.

    Raises:
        TrainingError: the folder is not writable or the disk is full.
    """
    separators = None if indent is not None else (",", ":")
    text = json.dumps(data, indent=indent, separators=separators) + "\n"
    return atomic_write_text(path, text, error=TrainingError)
