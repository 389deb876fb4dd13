"""``train.amp`` (``none``, ``auto``, ``bf16``, ``fp16``) on a device, the autocast context, the fp16 gradient scaler.

Values a device cannot run faster than float32 are refused; the loss and post-processing run in float32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from detr_peg.errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU with bf16, or a CPU with AMX or AVX512-BF16."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    cpu = torch.cpu
    return any(
        bool(getattr(cpu, name, lambda: False)()) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


def resolve_amp(amp: str, device: torch.device) -> str:
    """``none``, ``bf16`` or ``fp16`` for ``amp`` on ``device``; ``auto`` is ``bf16`` where :func:`native_bf16`."""
    if amp == "auto":
        return "bf16" if native_bf16(device) else "none"
    return amp


def evaluation_amp(train_amp: str, device: torch.device) -> str:
    """The resolved autocast for evaluating a ``train_amp`` checkpoint on ``device``, as its run evaluated; float32
    where ``device`` would only emulate it (``fp16``, or ``bf16`` without native bfloat16, on a CPU).

    Raises:
        ConfigError: as :func:`check_amp`.
    """
    native = device.type == "cuda" or (train_amp == "bf16" and native_bf16(device))
    amp = train_amp if native or train_amp == "auto" else "none"
    check_amp(amp, device)
    return resolve_amp(amp, device)


def check_amp(amp: str, device: torch.device, key: str = "train.amp") -> None:
    """Refuse a ``train.amp`` (or ``key``) that ``device`` would only emulate (slower than float32 and less precise).

    Raises:
        ConfigError: an unknown value; ``fp16`` on a CPU; ``bf16`` without native bfloat16; another device type.
    """
    if amp in ("none", "auto"):
        return
    if not isinstance(amp, str) or amp not in AMP_DTYPES:
        raise ConfigError(f"{key} is {amp!r}; valid are 'none', 'auto', 'bf16' and 'fp16'.")
    if device.type == "cpu":
        if amp == "fp16":
            raise ConfigError(f"{key}=fp16 needs a CUDA device; on the CPU use {key}=bf16 or auto.")
        if not native_bf16(device):
            raise ConfigError(
                f"{key}=bf16: this CPU has no native bfloat16 arithmetic (AMX or AVX512-BF16), so it would be "
                f"slower than float32; use {key}=none (or auto, which picks bf16 only where it is native)."
            )
        return
    if device.type != "cuda":
        raise ConfigError(f"{key}={amp} needs a CUDA device or a CPU; this run uses {device}. Use {key}=none.")
    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"{key}=bf16: this GPU does not support bfloat16; use {key}=fp16.")


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context for ``amp`` (a no-op for ``none``, and for ``auto`` without native bf16)."""
    resolved = resolve_amp(amp, device)
    if resolved == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[resolved])


def outputs_to_float(outputs: Any) -> Any:
    """Model outputs (nested dicts, lists, tuples) with floating tensors in float32 (matching and GIoU need it)."""
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
