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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import nn

from detr_peg.config.loader import config_to_dict
from detr_peg.config.schema import Config
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.distributed import DistEnv, broadcast_object
from detr_peg.errors import ConfigError, TrainingError, UserError

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


def without_backbone_weights(cfg: Config) -> Config:
    """``cfg`` whose backbone starts from random weights (a checkpoint provides them)."""
    return replace(cfg, model=replace(cfg.model, backbone=replace(cfg.model.backbone, weights=None)))


@contextlib.contextmanager
def determinism(cfg: Config, device: torch.device) -> Iterator[None]:
    """``train.deterministic``: deterministic kernels (a warning where none exists), no cuDNN autotuning.

    The process-wide settings are restored on exit, so a run called from
    Python leaves the caller's settings as they were.
    """
    if not cfg.train.deterministic:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark)
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
    """Convert BatchNorm layers to ``SyncBatchNorm`` when ``model.backbone.norm=sync_bn`` runs on several processes."""
    if cfg.model.backbone.norm == "sync_bn" and env.distributed:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


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
    """Write ``data`` as JSON atomically (temporary file, then rename); ``indent=None`` writes it compactly."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        separators = None if indent is not None else (",", ":")
        tmp.write_text(json.dumps(data, indent=indent, separators=separators) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TrainingError(f"Could not write {path}: {exc.strerror or exc}.") from None
    return path
