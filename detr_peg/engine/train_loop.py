"""One training epoch: forward, set loss, backward, clipping, optimizer step.

:func:`train_one_epoch` is a plain function over built objects. Run control
(iteration budget, checkpoints, stop requests) stays with the caller through
the ``after_step`` callback, which sees every finished iteration and may end
the epoch early.

Losses are checked before the backward pass and the gradient norm before the
optimizer step, on values averaged over processes so that every process
stops at the same iteration: a non-finite value raises
:class:`NonFiniteError` naming the iteration and the loss term (or the
gradient norm), and the weights are not updated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from detr_peg.engine.distributed import reduce_mean
from detr_peg.engine.loader import iterate_batches
from detr_peg.engine.lr_schedule import current_lrs
from detr_peg.engine.metrics_log import MetricsLog, format_duration
from detr_peg.engine.mixed_precision import autocast, outputs_to_float
from detr_peg.errors import TrainingError

#: Unweighted final-layer terms logged every iteration (aux terms only enter the total).
LOGGED_TERMS = ("loss_ce", "loss_bbox", "loss_giou", "class_error", "cardinality_error")


class NonFiniteError(TrainingError):
    """A loss term or the gradient norm became NaN or infinite.

    Attributes:
        iteration: the global iteration (1-based) that produced it.
        epoch: its epoch (0-based).
        term: the loss term, or ``"gradient norm"``.
        value: the offending value.
    """

    def __init__(self, iteration: int, epoch: int, term: str, value: float) -> None:
        self.iteration, self.epoch, self.term, self.value = iteration, epoch, term, value
        super().__init__(f"Non-finite {term} ({value}) at iteration {iteration} (epoch {epoch})")


@dataclass
class EpochStats:
    """What one call of :func:`train_one_epoch` did.

    Attributes:
        batches_done: batches of the epoch finished after the call, including
            those done before a mid-epoch resume.
        iteration: the global iteration count after the call.
        completed: every batch of the epoch was trained.
        means: averages over the iterations of this call (``loss``, the
            logged terms, ``grad_norm``).
        skipped_image_ids: unreadable images left out (``data.on_bad_sample=skip``)
            in this process.
    """

    batches_done: int
    iteration: int
    completed: bool
    means: dict[str, float] = field(default_factory=dict)
    skipped_image_ids: set[int] = field(default_factory=set)


def _to_device(targets: list[dict], device: torch.device) -> list[dict]:
    return [
        {k: (v.to(device, non_blocking=True) if isinstance(v, Tensor) else v) for k, v in t.items()} for t in targets
    ]


def _first_non_finite(terms: dict[str, Tensor], weight_dict: dict[str, float]) -> tuple[str, float] | None:
    for key in weight_dict:
        if key in terms and not math.isfinite(float(terms[key])):
            return key, float(terms[key])
    return None


def train_one_epoch(
    model: nn.Module,
    criterion: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    epoch: int,
    iteration: int,
    batches_done: int = 0,
    batches_per_epoch: int,
    clip_max_norm: float = 0.0,
    amp: str = "none",
    scaler: torch.amp.GradScaler | None = None,
    log: MetricsLog | None = None,
    log_every: int = 20,
    after_step: Callable[[int, int], bool] | None = None,
) -> EpochStats:
    """Train over ``loader`` (the rest of one epoch).

    Args:
        model: the detector, possibly wrapped (DDP, ``torch.compile``).
        criterion: a :class:`~detr_peg.models.criterion.SetCriterion`.
        loader: yields ``(images Tensor[B, 3, H, W], mask Tensor[B, H, W]
            (True = padding), targets)``.
        optimizer: the optimizer of ``model``'s parameters.
        device: where the model is.
        epoch: the epoch (0-based), for logs and messages.
        iteration: global iterations done before this call.
        batches_done: batches of this epoch done before this call (resume).
        batches_per_epoch: batches in the whole epoch (for progress and ETA).
        clip_max_norm: gradient clipping max norm; 0 measures the norm only.
        amp: ``train.amp``.
        scaler: the fp16 gradient scaler, or None.
        log: metrics log and progress display (main process), or None.
        log_every: iterations between plain log lines and metrics records.
        after_step: called as ``after_step(batches_done, iteration)`` after each
            optimizer step; returning True ends the epoch there.

    Returns:
        :class:`EpochStats`.

    Raises:
        NonFiniteError: a loss term or the gradient norm is not finite (the
            weights are left as they were before the iteration).
    """
    model.train()
    criterion.train()
    params = [p for p in model.parameters() if p.requires_grad]
    tally = _Tally()
    bar = log.progress(total=batches_per_epoch, initial=batches_done, desc=f"epoch {epoch}") if log else None
    start = last = time.perf_counter()
    batches = iterate_batches(loader)
    try:
        for images, mask, targets in batches:
            data_time = time.perf_counter() - last
            step = dict(device=device, amp=amp, scaler=scaler, clip_max_norm=clip_max_norm, epoch=epoch)
            record = _train_step(
                model, criterion, optimizer, params, (images, mask, targets), iteration=iteration, **step
            )
            iteration, batches_done = iteration + 1, batches_done + 1
            now = time.perf_counter()
            tally.add(record, targets)
            if log is not None:
                eta = (now - start) / tally.count * (batches_per_epoch - batches_done)
                times = {"data_time": round(data_time, 4), "iter_time": round(now - last, 4)}
                lrs = current_lrs(optimizer)
                batch = (batches_done, batches_per_epoch)
                _log_iteration(log, bar, record, lrs, epoch=epoch, iteration=iteration, batch=batch,
                               log_every=log_every, times=times, eta=eta)  # fmt: skip
            last = now
            if after_step is not None and after_step(batches_done, iteration):
                break
    finally:
        batches.close()
        if log is not None:
            log.close_bar()
    completed = batches_done >= batches_per_epoch
    return EpochStats(batches_done, iteration, completed, means=tally.means(), skipped_image_ids=tally.skipped)


@dataclass
class _Tally:
    """Sums of the logged values over the iterations of one :func:`train_one_epoch` call."""

    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0
    skipped: set[int] = field(default_factory=set)

    def add(self, record: dict[str, float], targets: list[dict]) -> None:
        """Count one iteration's ``record`` and the images its batch left out."""
        self.skipped.update(i for t in targets for i in t.get("skipped_image_ids", ()))
        for key, value in record.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += 1

    def means(self) -> dict[str, float]:
        """Per logged value, its mean over the counted iterations (empty when none)."""
        return {k: v / self.count for k, v in self.sums.items()} if self.count else {}


def _train_step(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    batch: tuple[Tensor, Tensor, list[dict]],
    *,
    device: torch.device,
    amp: str,
    scaler: torch.amp.GradScaler | None,
    clip_max_norm: float,
    iteration: int,
    epoch: int,
) -> dict[str, float]:
    """One iteration on ``batch`` = ``(images, mask, targets)`` as the loader yields it.

    Returns:
        ``loss`` (the weighted total averaged over processes), the logged
        terms and ``grad_norm``.

    Raises:
        NonFiniteError: a loss term or the gradient norm is not finite.
    """
    images, mask, targets = batch
    images = images.to(device, non_blocking=True)
    mask = mask.to(device, non_blocking=True)
    targets = _to_device(targets, device)
    loss, reduced = _forward_loss(
        model, criterion, images, mask, targets, amp=amp, device=device, iteration=iteration, epoch=epoch
    )
    total = float(sum(reduced[k] * w for k, w in criterion.weight_dict.items() if k in reduced))
    grad_norm = _backward_step(
        loss, optimizer, params, scaler=scaler, clip_max_norm=clip_max_norm, iteration=iteration, epoch=epoch
    )
    return {"loss": total, **{k: float(reduced[k]) for k in LOGGED_TERMS if k in reduced}, "grad_norm": grad_norm}


def _forward_loss(
    model: nn.Module,
    criterion: nn.Module,
    images: Tensor,
    mask: Tensor,
    targets: list[dict],
    *,
    amp: str,
    device: torch.device,
    iteration: int,
    epoch: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The forward pass and the set loss of one batch.

    Returns:
        ``(loss, reduced)``: the weighted total of this process (for the
        backward pass) and the loss terms averaged over processes.

    Raises:
        NonFiniteError: a weighted loss term is not finite in some process.
    """
    weight_dict = criterion.weight_dict
    with autocast(amp, device):
        outputs = model(images, mask)
    # The loss in float32: matching and GIoU are sensitive to half precision.
    outputs = outputs_to_float(outputs)
    terms = criterion(outputs, targets)
    loss = criterion.weighted_total(terms)
    reduced = reduce_mean({k: v for k, v in terms.items() if k in weight_dict or k in LOGGED_TERMS})
    bad = _first_non_finite(reduced, weight_dict)
    if bad is not None:
        raise NonFiniteError(iteration + 1, epoch, f"loss term {bad[0]}", bad[1])
    return loss, reduced


def _backward_step(
    loss: Tensor,
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    *,
    scaler: torch.amp.GradScaler | None,
    clip_max_norm: float,
    iteration: int,
    epoch: int,
) -> float:
    """Backward, gradient clipping and the optimizer step; returns the gradient norm before clipping.

    Raises:
        NonFiniteError: the gradient norm is not finite without fp16 loss
            scaling (the weights are not updated).
    """
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    max_norm = clip_max_norm if clip_max_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not math.isfinite(grad_norm) and scaler is None:
        raise NonFiniteError(iteration + 1, epoch, "gradient norm", grad_norm)
    if scaler is not None:
        scaler.step(optimizer)  # skips the step when fp16 gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    return grad_norm


def _log_iteration(
    log: MetricsLog,
    bar: Any,
    record: dict[str, float],
    lrs: dict[str, float],
    *,
    epoch: int,
    iteration: int,
    batch: tuple[int, int],
    log_every: int,
    times: dict[str, float],
    eta: float,
) -> None:
    """Advance the progress bar; every ``log_every`` iterations (and the first) write an ``iter`` record and a line.

    Args:
        record: ``loss`` (the weighted total), the logged terms and ``grad_norm``.
        lrs: the learning rate of each parameter group.
        batch: ``(batches done in the epoch, batches per epoch)``.
        times: ``data_time`` and ``iter_time`` in seconds.
        eta: seconds left in the epoch.
    """
    lr = next(iter(lrs.values()))
    log.step(bar, loss=record["loss"], lr=lr)
    if iteration == 1 or iteration % max(log_every, 1) == 0:
        log.write({"type": "iter", "epoch": epoch, "iteration": iteration, "batch": batch[0], **record, **lrs, **times})
        log.line(
            f"epoch {epoch} [{batch[0]}/{batch[1]}] iter {iteration} loss {record['loss']:.4f} lr {lr:.2e} "
            f"grad {record['grad_norm']:.3f} eta {format_duration(eta)}"
        )
