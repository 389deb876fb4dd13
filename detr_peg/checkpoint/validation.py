"""A checkpoint is checked as a whole when read, before any of it is used (Rule 6 of docs/guarantees.md)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from detr_peg.config.ranges import is_whole
from detr_peg.errors import CheckpointError
from detr_peg.messages import shortened


def _kind(value: Any) -> str:  # what a value is, in a few words, for messages
    if isinstance(value, Tensor):
        layout = "" if value.layout == torch.strided else f"{str(value.layout).replace('torch.', '')} "
        return f"a {layout}{str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {shortened(repr(value))}"


def check_checkpoint_fields(obj: Mapping[str, Any], spec: str) -> None:
    """Check every field of a checkpoint dict from file ``spec``; raises CheckpointError for the first bad one."""
    check_state_dict(obj.get("model"), spec)
    if "train_weights" in obj:  # a run with a weight average: the weights the optimizer steps
        check_state_dict(obj["train_weights"], spec, "train_weights")
    label_map = obj.get("label_map")
    if label_map is not None and not isinstance(label_map, Mapping):
        raise CheckpointError(f"{spec}: 'label_map' holds {_kind(label_map)}; it must be a mapping or null.")
    for key in ("epoch", "iteration", "epoch_batches_done", "train_images", "ema_updates"):
        if key in obj and (not is_whole(obj[key]) or obj[key] < 0):
            raise CheckpointError(f"{spec}: '{key}' holds {_kind(obj[key])}; it must be an integer of at least 0.")
    for key in ("optimizer", "lr_scheduler", "grad_scaler"):
        if key in obj and not isinstance(obj[key], Mapping):
            raise CheckpointError(f"{spec}: '{key}' holds {_kind(obj[key])}; it must be a state dict (a mapping).")
    skipped = obj.get("skipped_image_ids", [])
    if not isinstance(skipped, (list, tuple)) or not all(is_whole(i) for i in skipped):
        raise CheckpointError(f"{spec}: 'skipped_image_ids' holds {_kind(skipped)}; it must be a list of integers.")
    if "rng" in obj:
        _check_rng(obj["rng"], spec)


def check_state_dict(state: Any, spec: str, field: str = "model") -> None:
    """Names to dense tensors, or one sentence naming the first entry that is not."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{spec}: '{field}' holds {_kind(state)}; it must map parameter names to tensors.")
    for key, value in state.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{spec}: '{field}' has a key {key!r} that is not a parameter name (a string).")
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{spec}: '{field}.{key}' holds {_kind(value)}, not a tensor.")
        if value.layout != torch.strided or value.is_quantized or value.is_meta:
            raise CheckpointError(
                f"{spec}: '{field}.{key}' holds {_kind(value)}; weights must be dense tensors with values."
            )


def _check_rng(rng: Any, spec: str) -> None:
    """Each process's generator states, tried on throw-away generators (never the global ones)."""
    if not isinstance(rng, (list, tuple)):
        raise CheckpointError(f"{spec}: 'rng' holds {_kind(rng)}; it must be a list with one entry per process.")
    for rank, state in enumerate(rng):
        where = f"{spec}: 'rng[{rank}]'"
        if not isinstance(state, Mapping) or not {"torch", "python", "numpy"} <= state.keys():
            raise CheckpointError(f"{where} holds {_kind(state)}; it needs the 'torch', 'python' and 'numpy' states.")
        try:
            torch.Generator().set_state(state["torch"])
            version, internal, gauss = state["python"]
            random.Random().setstate((version, tuple(internal), gauss))
            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.RandomState().set_state(
                (name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached))
            )
            if "cuda" in state and not (isinstance(state["cuda"], Tensor) and state["cuda"].dtype == torch.uint8):
                raise TypeError("the 'cuda' state is not a uint8 tensor")
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointError(f"{where} is not a generator state that can be restored ({reason}).") from None
