"""The optimizer, the learning-rate schedule and the mixed-precision set-up.

AdamW over the parameter groups of
:func:`~detr_peg.engine.param_groups.build_param_groups` (backbone at
``train.lr_backbone``, Deformable-DETR's sampling offsets and reference points
at ``train.lr * train.lr_linear_proj_mult``, everything else at ``train.lr``),
with ``train.weight_decay`` on every group (the fused implementation when every
parameter is on the CPU or a CUDA device: one pass over the parameters instead
of a dozen, four times faster for DETR-R50 on the CPU), and the learning-rate
schedule (:class:`LrSchedule`): an optional linear warm-up over the first
``train.warmup_iters`` iterations, and a StepLR stepped once per epoch that
multiplies the learning rate by ``train.lr_gamma`` every ``train.lr_drop`` epochs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn

from detr_peg.config.schema import TrainConfig
from detr_peg.engine.param_groups import build_param_groups
from detr_peg.errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: Device types with a fused AdamW kernel.
FUSED_DEVICES = {"cpu", "cuda"}


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the named parameter groups of ``model`` (the bare detector), fused where available.

    Build it after moving ``model`` to its device.

    Raises:
        ConfigError: a negative learning rate or weight decay, or no trainable
            parameter at all.
    """
    for key in ("lr", "lr_backbone", "lr_linear_proj_mult", "weight_decay"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"train.{key} must not be negative, got {getattr(cfg, key)}.")
    groups = build_param_groups(model, cfg)
    if not groups:
        raise ConfigError("The model has no trainable parameter; check model.backbone.train and frozen_stages.")
    devices = {param.device.type for group in groups for param in group["params"]}
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=devices <= FUSED_DEVICES or None)


#: Warm-up starts every learning rate at this fraction of its value.
WARMUP_START_FACTOR = 0.001


class LrSchedule:
    """Linear warm-up per iteration, then a step drop per epoch; one state dict for checkpoints.

    Both parts are torch schedulers in their chainable form (each multiplies
    the current learning rate), so a drop that falls inside the warm-up still
    applies.

    Args:
        optimizer: the optimizer whose group learning rates are scheduled.
        lr_drop: epochs between drops.
        lr_gamma: factor of each drop.
        warmup_iters: iterations over which every learning rate rises linearly
            from ``WARMUP_START_FACTOR`` times its value to its value (0: none).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, *, lr_drop: int, lr_gamma: float, warmup_iters: int = 0
    ) -> None:
        self.drop = torch.optim.lr_scheduler.StepLR(optimizer, step_size=lr_drop, gamma=lr_gamma)
        self.warmup = None
        if warmup_iters > 0:
            self.warmup = torch.optim.lr_scheduler.LinearLR(
                optimizer, start_factor=WARMUP_START_FACTOR, total_iters=warmup_iters
            )

    def step_iteration(self) -> None:
        """Call after every optimizer step (advances the warm-up; a no-op after it)."""
        if self.warmup is not None and self.warmup.last_epoch < self.warmup.total_iters:
            self.warmup.step()

    def step(self) -> None:
        """Call after every completed epoch (the step drop)."""
        self.drop.step()

    def state_dict(self) -> dict[str, Any]:
        return {"drop": self.drop.state_dict(), "warmup": self.warmup.state_dict() if self.warmup is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (or a bare StepLR state of older checkpoints)."""
        if "drop" not in state:
            self.drop.load_state_dict(state)
            return
        self.drop.load_state_dict(state["drop"])
        if self.warmup is not None and state.get("warmup") is not None:
            self.warmup.load_state_dict(state["warmup"])


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LrSchedule:
    """The schedule of ``train.warmup_iters``, ``train.lr_drop`` and ``train.lr_gamma``.

    Raises:
        ConfigError: ``lr_drop`` is not positive or ``warmup_iters`` is negative.
    """
    if cfg.lr_drop < 1:
        raise ConfigError(f"train.lr_drop must be a positive number of epochs, got {cfg.lr_drop}.")
    if cfg.warmup_iters < 0:
        raise ConfigError(
            f"train.warmup_iters must be 0 (no warm-up) or a positive number of iterations, got {cfg.warmup_iters}."
        )
    return LrSchedule(optimizer, lr_drop=cfg.lr_drop, lr_gamma=cfg.lr_gamma, warmup_iters=cfg.warmup_iters)


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


def current_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """The learning rate of each named group (``lr_transformer``, ``lr_backbone``, ...)."""
    return {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(optimizer.param_groups)}
