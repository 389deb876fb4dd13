"""Nothing is reported from numbers that are not finite (Rule 2 of docs/guarantees.md): weights when loaded and
before a checkpoint is replaced, model outputs before post-processing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from detr_peg.errors import CheckpointError, TrainingError, UserError


def _first_non_finite(state: Mapping[str, Tensor]) -> tuple[str, int, str] | None:
    """``(key, count, example)`` of the first floating tensor holding NaN or infinity, else None."""
    for key, value in state.items():
        if isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex()):
            bad = ~torch.isfinite(value)
            count = int(bad.sum())
            if count:
                example = str(value[bad].flatten()[0].item())
                return key, count, example
    return None


def check_loaded_weights(state: Mapping[str, Tensor], own: Mapping[str, Tensor], source: str) -> None:
    """Refuse weights whose dtype kind differs from the model's ``own`` (no silent int cast) or that are not finite.

    Raises CheckpointError naming ``source``, the key and the problem.
    """
    for key, mine in own.items():
        value = state.get(key)
        if not isinstance(value, Tensor):
            if key in state:
                raise CheckpointError(f"{source}: '{key}' holds a {type(value).__name__}, not a tensor.")
            continue
        if mine.is_floating_point() and not value.is_floating_point():
            raise CheckpointError(
                f"{source}: '{key}' holds {str(value.dtype).replace('torch.', '')} values but the model expects "
                f"floating point ({str(mine.dtype).replace('torch.', '')}); the file was not written as weights "
                "of this model."
            )
    bad = _first_non_finite(state)
    if bad is not None:
        key, count, example = bad
        raise CheckpointError(
            f"{source}: '{key}' holds {count} non-finite values ({example}); refusing to use weights that "
            "cannot give finite results."
        )


def check_saved_weights(state: Mapping[str, Tensor], iteration: int, checkpoint: Any) -> None:
    """Refuse to replace a checkpoint with non-finite weights; raises TrainingError (the previous one is kept)."""
    bad = _first_non_finite(state)
    if bad is not None:
        key, count, example = bad
        raise TrainingError(
            f"Non-finite weights after iteration {iteration} ('{key}' holds {count} values like {example}); "
            f"training stopped and the previous checkpoint {checkpoint} (if any) is kept. Lower train.lr or keep "
            "train.clip_max_norm > 0."
        )


def check_outputs(outputs: Mapping[str, Any], what: str = "The model") -> None:
    """Refuse non-finite model outputs before anything is computed from them; raises UserError naming the output."""
    tensors = {key: value for key, value in outputs.items() if isinstance(value, Tensor)}
    bad = _first_non_finite(tensors)
    if bad is not None:
        key, count, example = bad
        raise UserError(
            f"{what} produced {count} non-finite values ({example}) in '{key}'; no metrics or detections are "
            "reported from them (check the weights, or train again with a lower train.lr)."
        )
