"""Mixed precision: what ``train.amp`` means on a device, the autocast context, the fp16 gradient scaler.

``train.amp`` is ``none``, ``auto`` (bfloat16 where the device computes it
natively, float32 elsewhere), ``bf16`` or ``fp16`` (CUDA only). Values a
device cannot run faster than float32 are refused rather than silently
emulated. The loss and the post-processing always run in float32
(:func:`outputs_to_float`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from detr_peg.errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (faster than float32).

    A CUDA GPU with bfloat16 support, or a CPU with AMX or AVX512-BF16
    instructions (oneDNN then runs convolutions and matrix products in
    bfloat16; without them it emulates bfloat16, slower than float32).
    """
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    cpu = torch.cpu
    return any(
        bool(getattr(cpu, name, lambda: False)()) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


def resolve_amp(amp: str, device: torch.device) -> str:
    """The autocast dtype that ``train.amp`` means on ``device``: ``none``, ``bf16`` or ``fp16``.

    ``auto`` is ``bf16`` where :func:`native_bf16` holds and ``none`` elsewhere;
    other values are returned as they are (see :func:`check_amp`).
    """
    if amp == "auto":
        return "bf16" if native_bf16(device) else "none"
    return amp


def evaluation_amp(train_amp: str, device: torch.device) -> str:
    """The resolved autocast for evaluating a checkpoint trained with ``train_amp`` on ``device``.

    Mixed precision only where it exists: a checkpoint trained with ``bf16`` or
    ``fp16`` on a GPU evaluates on the CPU in float32; ``auto`` resolves on the
    evaluating device (bf16 on a CPU with native bfloat16, as in training there).

    Raises:
        ConfigError: as :func:`check_amp`, for the value used on ``device``.
    """
    amp = train_amp if device.type == "cuda" or train_amp == "auto" else "none"
    check_amp(amp, device)
    return resolve_amp(amp, device)


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse a ``train.amp`` that ``device`` cannot run faster than float32.

    Raises:
        ConfigError: an unknown value; ``fp16`` on a CPU; ``bf16`` on a CPU
            without AMX or AVX512-BF16 or on a GPU without bfloat16 (it would be
            emulated: slower and less precise, so it is refused rather than
            silently run); mixed precision on another device type.
    """
    if amp in ("none", "auto"):
        return
    if amp not in AMP_DTYPES:
        raise ConfigError(f"train.amp is {amp!r}; valid are 'none', 'auto', 'bf16' and 'fp16'.")
    if device.type == "cpu":
        if amp == "fp16":
            raise ConfigError("train.amp=fp16 needs a CUDA device; on the CPU use train.amp=bf16 or auto.")
        if not native_bf16(device):
            raise ConfigError(
                "train.amp=bf16: this CPU has no native bfloat16 arithmetic (AMX or AVX512-BF16), so it would be "
                "slower than float32; use train.amp=none (or auto, which picks bf16 only where it is native)."
            )
        return
    if device.type != "cuda":
        raise ConfigError(f"train.amp={amp} needs a CUDA device or a CPU; this run uses {device}. Use train.amp=none.")
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("train.amp=bf16: this GPU does not support bfloat16; use train.amp=fp16.")


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context for ``train.amp`` (a no-op for ``none``, and for ``auto`` without native bf16).

    Runs call it with the value :func:`resolve_amp` gave once at their start, so
    no per-batch call asks the device for its capabilities.
    """
    resolved = resolve_amp(amp, device)
    if resolved == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[resolved])


def outputs_to_float(outputs: Any) -> Any:
    """Model outputs (nested dicts and lists of tensors) with floating tensors in float32.

    The loss and the post-processing run in float32 after an autocast forward:
    matching costs and GIoU are sensitive to half precision.
    """
    if isinstance(outputs, Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, dict):
        return {k: outputs_to_float(v) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(outputs_to_float(v) for v in outputs)
    return outputs


def build_grad_scaler(amp: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 (bf16 and fp32 need none)."""
    if resolve_amp(amp, device) != "fp16":
        return None
    return torch.amp.GradScaler(device.type)
