"""Class 2: no result is reported from weights or outputs that are not sound.

Weights are checked when loaded (floating point where the model expects it,
every value finite) and when a training checkpoint is about to replace the
last good one; model outputs are checked before any detection or metric is
computed. Each case feeds broken weights to a command, or makes the model's
outputs overflow with finite weights, and must get one line and every file
(the earlier ``metrics.json`` above all) byte-identical. The mechanism:
:mod:`detr_peg.checkpoint.weights_check`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from tests.reliability.conftest import BASE, IMAGES, OUT, RESUME
from tests.reliability.hostile_cases import Hostile, check_refused, ids

CKPT = OUT / "checkpoint.pth"


def _edited(name: str, change: Callable[[str, torch.Tensor], torch.Tensor]) -> Callable[[Path], None]:
    """A copy of the earlier run's checkpoint saved as ``name`` with ``change(key, tensor)`` applied to its weights."""

    def prepare(case: Path) -> None:
        ckpt = torch.load(case / CKPT, weights_only=True)
        ckpt["model"] = {key: change(key, value) for key, value in ckpt["model"].items()}
        torch.save(ckpt, case / name)

    return prepare


def _all_nan(key: str, value: torch.Tensor) -> torch.Tensor:
    return torch.full_like(value, float("nan")) if value.is_floating_point() else value


def _one_inf(key: str, value: torch.Tensor) -> torch.Tensor:
    if key == "class_embed.bias":
        value = value.clone()
        value[1] = float("inf")
    return value


def _as_int64(key: str, value: torch.Tensor) -> torch.Tensor:
    return value.round().long() if value.is_floating_point() else value


def _as_int32(key: str, value: torch.Tensor) -> torch.Tensor:
    return value.round().int() if value.is_floating_point() else value


def _as_float8(key: str, value: torch.Tensor) -> torch.Tensor:
    return value.to(torch.float8_e4m3fn) if value.is_floating_point() else value


def _overflowing(key: str, value: torch.Tensor) -> torch.Tensor:
    """Finite weights whose projection of the backbone features overflows float32."""
    return torch.full_like(value, 3e38) if key == "input_proj.weight" else value


def _nan_safetensors(case: Path) -> None:
    ckpt = read_checkpoint(case / CKPT)
    save_checkpoint(
        case / "nan.safetensors", ckpt.config, {k: _all_nan(k, v) for k, v in ckpt.model.items()}, ckpt.label_map
    )


def _nan_resume(case: Path) -> None:
    _edited(str(CKPT), _all_nan)(case)


def _eval(checkpoint: str) -> list:
    return ["eval", "--checkpoint", checkpoint, "--output", OUT]


def _predict(checkpoint: str) -> list:
    return ["predict", "--checkpoint", checkpoint, IMAGES, "--output", OUT / "predictions"]


NEW_RUN = ["train", *BASE, "train.output_dir=blow", "train.epochs=1"]

CASES = [
    Hostile(
        "eval-all-nan-weights", _eval("nan.pth"), ["nan.pth", "non-finite values (nan)"], _edited("nan.pth", _all_nan)
    ),
    Hostile(
        "eval-one-infinite-bias",
        _eval("inf.pth"),
        ["inf.pth", "'class_embed.bias' holds 1 non-finite values (inf)"],
        _edited("inf.pth", _one_inf),
    ),
    Hostile(
        "predict-all-nan-weights", _predict("nan.pth"), ["nan.pth", "non-finite values"], _edited("nan.pth", _all_nan)
    ),
    Hostile(
        "eval-int64-weights",
        _eval("int.pth"),
        ["int.pth", "holds int64 values, not the float32 weights it needs"],
        _edited("int.pth", _as_int64),
    ),
    Hostile(
        "predict-int32-weights", _predict("int.pth"), ["int.pth", "holds int32 values"], _edited("int.pth", _as_int32)
    ),
    Hostile(
        "eval-float8-weights",
        _eval("f8.pth"),
        ["f8.pth", "holds float8_e4m3fn values, not the float32 weights it needs"],
        _edited("f8.pth", _as_float8),
    ),
    Hostile(
        "eval-nan-safetensors", _eval("nan.safetensors"), ["nan.safetensors", "non-finite values"], _nan_safetensors
    ),
    Hostile(
        "init-from-nan-weights",
        [*NEW_RUN, "train.init_from=nan.pth"],
        ["nan.pth", "non-finite values"],
        _edited("nan.pth", _all_nan),
    ),
    Hostile("resume-nan-checkpoint", RESUME, [str(CKPT), "non-finite values"], _nan_resume),
    Hostile(
        "eval-outputs-overflow",
        _eval("big.pth"),
        ["The model produced", "non-finite values", "no metrics or detections are reported"],
        _edited("big.pth", _overflowing),
    ),
    Hostile(
        "predict-outputs-overflow",
        _predict("big.pth"),
        ["The model produced", "non-finite values"],
        _edited("big.pth", _overflowing),
    ),
    Hostile(
        "train-lr-beyond-float32",
        [*NEW_RUN, "train.lr=1e39", "train.max_iters=1"],
        ["Non-finite weights after iteration 1", "train.lr"],
        kept="out",
    ),
    Hostile("train-lr-infinite", [*NEW_RUN, "train.lr=.inf", "train.max_iters=1"], ["train.lr"], kept="out"),
]


@pytest.mark.parametrize("spec", CASES, ids=ids(CASES))
def test_unsound_weights_or_outputs_report_nothing(cli, case: Path, spec: Hostile) -> None:
    check_refused(cli, case, spec)
