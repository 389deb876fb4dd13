"""Training checkpoints (``<output_dir>/checkpoint.pth``): writing, resuming, starting from other weights, seeds.

A detr_peg checkpoint (:mod:`detr_peg.checkpoint.format`) plus the training state, replaced atomically.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from detr_peg.checkpoint.format import Checkpoint, load_weights, read_checkpoint, save_checkpoint
from detr_peg.checkpoint.weights_check import check_saved_weights
from detr_peg.config.loader import save_config
from detr_peg.config.schema import Config
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.weight_average import EMA_UPDATES, TRAIN_WEIGHTS, WeightAverage
from detr_peg.errors import CheckpointError, TrainingError
from detr_peg.messages import listed
from detr_peg.outputs import remove_stale

CHECKPOINT_NAME = "checkpoint.pth"

#: Write errors that mean a full disk or quota, or a file-size limit, rather than permissions.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

#: Parameter-name fragment of the classification heads (re-initialised by ``train.reset_classifier``).
CLASSIFIER_KEY = "class_embed"

#: State-dict prefix of the positional encoding's own weights (learned tables, PEG convolutions and BatchNorm).
POSITION_PREFIX = "transformer.position."

logger = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands; ``epoch_batches_done``: batches of epoch ``epoch``; ``skipped_image_ids``: all ranks'."""

    epoch: int = 0
    epoch_batches_done: int = 0
    iteration: int = 0
    skipped_image_ids: set[int] = field(default_factory=set)

    @property
    def last_epoch(self) -> int:
        """The epoch of the last trained batch (``epoch`` is already the next one after a completed epoch)."""
        return self.epoch - 1 if self.epoch_batches_done == 0 and self.epoch > 0 else self.epoch


def checkpoint_path(output_dir: str | Path) -> Path:
    """The checkpoint file of an output folder."""
    return Path(output_dir) / CHECKPOINT_NAME


def estimate_checkpoint_bytes(model: nn.Module) -> int:
    """About how many bytes a training checkpoint of ``model`` takes (weights + two AdamW moments)."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    moments = sum(2 * p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return weights + moments + (1 << 20)


def check_output_dir(output_dir: str | Path, needed_bytes: int) -> Path:
    """Create ``output_dir``, test-write it, check room for one more checkpoint; TrainingError if any of it fails."""
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainingError(
            f"Output folder {folder} cannot be created ({exc.strerror or exc}); choose another train.output_dir."
        ) from None
    probe = folder / f".write-test-{os.getpid()}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise TrainingError(
                f"Output folder {folder} has no room to write ({exc.strerror or exc}); free some space or "
                "choose another train.output_dir."
            ) from None
        raise TrainingError(
            f"Output folder {folder} is not writable ({exc.strerror or exc}); choose another train.output_dir "
            "or fix its permissions."
        ) from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    remove_stale_temporaries(folder)
    free = shutil.disk_usage(folder).free
    margin = int(needed_bytes * 1.2) + (32 << 20)
    if free < margin:
        raise TrainingError(
            f"Output folder {folder} has {free / 2**20:.0f} MiB free but a checkpoint needs about "
            f"{needed_bytes / 2**20:.0f} MiB (plus room for the next one while it is written); free some space "
            "or choose another train.output_dir."
        )
    return folder


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporaries of killed runs (``.checkpoint.pth.tmp-<pid>`` of a gone process), before the disk check."""
    return [p for name in (CHECKPOINT_NAME, "metrics.json", "detections.json", "config.yaml")
            for p in remove_stale(folder, f".{name}.tmp-")]  # fmt: skip


def save_training_checkpoint(
    path: str | Path,
    *,
    cfg: Config,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    grad_scaler: torch.amp.GradScaler | None,
    label_map: LabelMap,
    progress: Progress,
    rng_states: list[dict],
    world_size: int,
    train_images: int | None = None,
    weight_average: WeightAverage | None = None,
) -> None:
    """Write the training checkpoint atomically (main process); on failure, TrainingError and the previous file intact.

    Training state: ``optimizer``, ``lr_scheduler``, ``grad_scaler`` (fp16), ``epoch``, ``epoch_batches_done``,
    ``iteration``, ``rng`` (per process), ``world_size``, ``skipped_image_ids``, ``train_images``. With a
    ``weight_average``, ``model`` holds the average and the stepped weights go to ``train_weights``.
    """
    weights = model.state_dict()
    check_saved_weights(weights, progress.iteration, path)
    extra: dict[str, Any] = {
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": progress.epoch,
        "epoch_batches_done": progress.epoch_batches_done,
        "iteration": progress.iteration,
        "rng": rng_states,
        "world_size": world_size,
        "skipped_image_ids": sorted(progress.skipped_image_ids),
    }
    if train_images is not None:
        extra["train_images"] = train_images
    if grad_scaler is not None:
        extra["grad_scaler"] = grad_scaler.state_dict()
    if weight_average is not None:
        extra[TRAIN_WEIGHTS], extra[EMA_UPDATES] = weights, weight_average.updates
        weights = weight_average.state_dict()
        check_saved_weights(weights, progress.iteration, path)
    try:
        save_checkpoint(path, cfg, weights, label_map.to_dict(), **extra)
    except CheckpointError as exc:
        raise TrainingError(
            f"{exc} Training stopped at iteration {progress.iteration}; the previous checkpoint (if any) is intact."
        ) from None


def restore_training_state(
    ckpt: Checkpoint,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    grad_scaler: torch.amp.GradScaler | None,
    rank: int,
    world_size: int,
    device: torch.device,
    weight_average: WeightAverage | None = None,
    config: Config | None = None,
) -> Progress:
    """Restore model, optimizer, schedule, scaler, average and RNG from ``ckpt`` into the model of ``config``;
    CheckpointError if they do not fit."""
    extra = ckpt.extra
    for key in ("optimizer", "lr_scheduler", "epoch", "iteration"):
        if key not in extra:
            raise CheckpointError(
                f"{ckpt.path} has no '{key}' entry: it holds weights only, not a training state to resume; "
                "use train.init_from to start a new run from it."
            )
    averaged = TRAIN_WEIGHTS in extra
    configs = None if config is None else (ckpt.config, config)
    load_weights(model, extra[TRAIN_WEIGHTS] if averaged else ckpt.model, f"Checkpoint {ckpt.path}", configs)
    if weight_average is not None:
        if averaged:
            weight_average.load(ckpt.model, int(extra.get(EMA_UPDATES, 0)))
        else:
            weight_average.load(model.state_dict(), 0)
    states = [("optimizer", optimizer), ("lr_scheduler", lr_scheduler)]
    if grad_scaler is not None and "grad_scaler" in extra:
        states.append(("grad_scaler", grad_scaler))
    for key, owner in states:
        try:
            owner.load_state_dict(extra[key])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError) as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(
                f"The '{key}' state in {ckpt.path} does not fit this run ({reason}); the trainable parameters "
                "or the schedule's kind changed, or the file was not written by detr-peg train."
            ) from None
    rng = extra.get("rng") or []
    if len(rng) == world_size:
        restore_rng_state(rng[rank], device)
    else:
        warnings.warn(
            f"{ckpt.path} was written by {len(rng)} processes and this run has {world_size}; the random "
            "generators start fresh, so the run is not an exact continuation.",
            stacklevel=2,
        )
    return Progress(
        epoch=int(extra["epoch"]),
        epoch_batches_done=int(extra.get("epoch_batches_done", 0)),
        iteration=int(extra["iteration"]),
        skipped_image_ids=set(int(i) for i in extra.get("skipped_image_ids", [])),
    )


def load_initial_weights(
    model: nn.Module,
    path: str,
    *,
    num_classes: int,
    label_map: LabelMap,
    reset_classifier: bool,
    position: str | None = None,
    arch: str | None = None,
    config: Config | None = None,
) -> Checkpoint:
    """Load another run's weights into a new run (``train.init_from``; official checkpoints need ``detr-peg convert``).

    ``reset_classifier`` keeps the new class heads, required for another number of classes (else CheckpointError).
    """
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as exc:
        raise CheckpointError(f"train.init_from: {exc}") from None
    if arch is not None and ckpt.config.model.arch != arch:
        raise CheckpointError(
            f"train.init_from {path} holds a {ckpt.config.model.arch} model but model.arch is {arch}; start from "
            f"a {arch} checkpoint, or set model.arch={ckpt.config.model.arch}."
        )
    stored_classes = ckpt.config.model.num_classes
    if stored_classes != num_classes and not reset_classifier:
        raise CheckpointError(
            f"train.init_from {path} was trained with {stored_classes} classes but this dataset needs "
            f"{num_classes}; set train.reset_classifier=true to fine-tune with a new classification head."
        )
    own = model.state_dict()
    state = dict(ckpt.model)
    if position is not None and position != ckpt.config.model.position.name:
        state = with_own_position_weights(state, own, f"train.init_from {path}")
    if reset_classifier:
        for key in own:
            if CLASSIFIER_KEY in key:
                state[key] = own[key]
    elif ckpt.label_map is not None and LabelMap.from_dict(ckpt.label_map) != label_map:
        warnings.warn(
            f"train.init_from {path} has the same number of classes but other categories than this dataset; "
            "its class head is kept (set train.reset_classifier=true to start it fresh).",
            stacklevel=2,
        )
    load_weights(model, state, f"train.init_from {path}", None if config is None else (ckpt.config, config))
    return ckpt


def with_own_position_weights(
    state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], source: str
) -> dict[str, torch.Tensor]:
    """``state`` with its ``transformer.position.*`` weights replaced by ``own``'s, for a model of another encoding.

    Every other weight has the same shape under any encoding; ``source`` names ``state`` in the log.
    """
    fresh = sorted(k for k in own if k.startswith(POSITION_PREFIX))
    dropped = sorted(k for k in state if k.startswith(POSITION_PREFIX))
    kept = {k: v for k, v in state.items() if not k.startswith(POSITION_PREFIX)}
    kept.update({k: own[k] for k in fresh})
    logger.info(
        f"{source} has another positional encoding: {len(kept) - len(fresh)} weights loaded, "
        f"{len(fresh)} of the encoding start fresh ({listed(fresh, 4) or 'none'}), "
        f"{len(dropped)} of the checkpoint's encoding left out."
    )
    return kept


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python's ``random`` and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """The global generator states of this process, as plain data for a checkpoint."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _python_state_to_plain(random.getstate()),
        "numpy": _numpy_state_to_plain(np.random.get_state()),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(_python_state_from_plain(state["python"]))
    np.random.set_state(_numpy_state_from_plain(state["numpy"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _python_state_to_plain(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_state_from_plain(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _numpy_state_to_plain(state: tuple) -> list:
    name, keys, pos, has_gauss, cached = state
    return [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)]


def _numpy_state_from_plain(state: list) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached)


def write_config(cfg: Config, out: Path) -> None:
    """Write ``out/config.yaml``; TrainingError when it cannot."""
    try:
        save_config(cfg, out / "config.yaml")
    except OSError as exc:
        raise TrainingError(f"Could not write {out / 'config.yaml'}: {exc.strerror or exc}.") from None
