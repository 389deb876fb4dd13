"""Nothing is reported from numbers that are not finite (Rule 2 of docs/guarantees.md)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from detr_peg.errors import CheckpointError, TrainingError, UserError

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def non_finite(tensors: Mapping[str, Any]) -> Iterator[tuple[str, int, str]]:
    """``(key, count, example)`` of each floating tensor holding NaN or infinity; the callers raise at the first."""
    for key, value in tensors.items():
        if isinstance(value, Tensor) and value.dtype in FLOATS:
            bad = ~torch.isfinite(value)
            if bad.any():
                yield key, int(bad.sum()), str(value[bad].flatten()[0].item())


def check_loaded_weights(state: Mapping[str, Tensor], own: Mapping[str, Tensor], source: str) -> None:
    """Refuse (CheckpointError naming ``source`` and the key) weights that are not finite, or not of :data:`FLOATS`
    where the model's ``own`` are floating point: an int or float8 checkpoint is never cast."""
    for key, mine in own.items():
        value = state.get(key)
        if key in state and not isinstance(value, Tensor):
            raise CheckpointError(f"{source}: '{key}' holds a {type(value).__name__}, not a tensor.")
        if value is not None and mine.is_floating_point() and value.dtype not in FLOATS:
            got, expected = (str(t.dtype).replace("torch.", "") for t in (value, mine))
            raise CheckpointError(f"{source}: '{key}' holds {got} values, not the {expected} weights it needs.")
    for key, count, example in non_finite(state):
        raise CheckpointError(f"{source}: '{key}' holds {count} non-finite values ({example}); refusing these weights.")


def check_saved_weights(state: Mapping[str, Tensor], iteration: int, checkpoint: Any) -> None:
    """Refuse to replace a checkpoint with non-finite weights: TrainingError, and the previous checkpoint is kept."""
    for key, count, example in non_finite(state):
        raise TrainingError(
            f"Non-finite weights after iteration {iteration} ('{key}' holds {count} values like {example}); "
            f"training stopped and the previous checkpoint {checkpoint} (if any) is kept. Lower train.lr or keep "
            "train.clip_max_norm > 0."
        )


def check_outputs(outputs: Mapping[str, Any], what: str = "The model") -> None:
    """Refuse non-finite model outputs before anything is computed from them: UserError naming the output."""
    for key, count, example in non_finite(outputs):
        raise UserError(
            f"{what} produced {count} non-finite values ({example}) in '{key}'; no metrics or detections are "
            "reported from them (check the weights, or train again with a lower train.lr)."
        )
