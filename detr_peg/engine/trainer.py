"""The training loop: :class:`Trainer` runs epochs of :func:`train_step` and asks its :class:`HookBase` hooks.

Losses and the gradient norm are checked on values averaged over processes, so every process stops together.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import CocoDetection
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.checkpointing import (
    Progress,
    capture_rng_state,
    checkpoint_path,
    save_training_checkpoint,
    write_config,
)
from detr_peg.engine.distributed import DistEnv, all_gather_objects, on_main, reduce_mean
from detr_peg.engine.inference import too_small_for_norm
from detr_peg.engine.loader import build_train_loader, iterate_batches
from detr_peg.engine.metrics_log import MetricsLog, format_duration
from detr_peg.engine.mixed_precision import autocast, outputs_to_float
from detr_peg.engine.optimizer import LrSchedule, current_lrs
from detr_peg.engine.weight_average import WeightAverage
from detr_peg.errors import TrainingError

#: Unweighted final-layer terms logged every iteration (aux terms only enter the total).
LOGGED_TERMS = ("loss_ce", "loss_bbox", "loss_giou", "class_error", "cardinality_error")


class NonFiniteError(TrainingError):
    """A loss term or the gradient norm became NaN or infinite (``iteration`` 1-based, ``epoch`` 0-based)."""

    def __init__(self, iteration: int, epoch: int, term: str, value: float) -> None:
        self.iteration, self.epoch, self.term, self.value = iteration, epoch, term, value
        super().__init__(f"Non-finite {term} ({value}) at iteration {iteration} (epoch {epoch})")


@dataclass
class EpochStats:
    """What one :meth:`Trainer.train_epoch` call did.

    ``batches_done`` includes those before a resume; ``means`` average this call; ``skipped_image_ids``: this rank's.
    """

    epoch: int
    batches_done: int
    completed: bool
    means: dict[str, float] = field(default_factory=dict)
    skipped_image_ids: set[int] = field(default_factory=set)


class HookBase:
    """A training hook; override the points it needs. The trainer asks every hook, in its order::

        context(trainer)            a context manager entered for the whole run
        stop_training(trainer)      before each epoch: True ends the run
        halt_epoch(trainer)         after each optimizer step, first: True ends the epoch after this step
        after_step(trainer)         then, after each optimizer step (``trainer.halt``: the epoch ends)
        after_epoch(trainer, stats) after each epoch, or the part of it trained before a halt
        after_train(trainer)        once, when training ended without an error

    ``halt_epoch`` is asked of every hook in every process (some answers are collective operations).
    """

    def context(self, trainer: Trainer) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def stop_training(self, trainer: Trainer) -> bool:
        return False

    def halt_epoch(self, trainer: Trainer) -> bool:
        return False

    def after_step(self, trainer: Trainer) -> None:
        pass

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        pass

    def after_train(self, trainer: Trainer) -> None:
        pass


@dataclass(kw_only=True, eq=False, repr=False)
class Trainer:
    """The training loop, built by :func:`~detr_peg.engine.training.run_training`.

    ``model`` is the bare detector (checkpoints, evaluation); ``train_model`` is what is stepped (``model``, maybe in
    DDP and/or ``torch.compile``); ``log`` is None outside the main process; ``config_pending``: ``config.yaml`` still
    describes the checkpoint being resumed; ``weight_average`` (``train.ema_decay``) is what is evaluated and stored;
    ``halt``: the epoch ends after this step.
    """

    cfg: Config
    env: DistEnv
    out: Path
    train_set: CocoDetection
    val_set: CocoDetection | None
    label_map: LabelMap
    per_epoch: int
    model: nn.Module
    train_model: nn.Module
    criterion: nn.Module
    postprocessor: nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: LrSchedule
    scaler: torch.amp.GradScaler | None
    amp: str
    progress: Progress
    log: MetricsLog | None
    config_pending: bool
    hooks: Sequence[HookBase] = ()
    weight_average: WeightAverage | None = None
    halt: bool = field(default=False, init=False)

    @property
    def eval_model(self) -> nn.Module:
        """What the run evaluates and stores as its weights: the weight average if any, else ``model``."""
        return self.model if self.weight_average is None else self.weight_average.module

    @property
    def ckpt_file(self) -> Path:
        """The run's checkpoint (``<output_dir>/checkpoint.pth``)."""
        return checkpoint_path(self.out)

    def stop_training(self) -> bool:
        """Whether a hook ends the run before the next epoch (the iteration budget)."""
        return any([hook.stop_training(self) for hook in self.hooks])

    def train(self) -> dict[str, float]:
        """Train until ``train.epochs`` or a hook ends the run; returns the last epoch's mean losses."""
        losses: dict[str, float] = {}
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.context(self))
            for epoch in range(self.progress.epoch, self.cfg.train.epochs):
                if self.stop_training():
                    break
                stats = self.train_epoch(epoch)
                losses = stats.means
                self.end_epoch(stats)
        for hook in self.hooks:
            hook.after_train(self)
        return losses

    def train_epoch(self, epoch: int) -> EpochStats:
        """Train the rest of ``epoch`` until it ends or a hook halts it; TrainingError on a non-finite loss or grad."""
        t, progress = self.cfg.train, self.progress
        start = progress.epoch_batches_done
        loader = build_train_loader(
            self.train_set, self.cfg, self.env, epoch=epoch, size_divisibility=self.model.size_divisibility,
            start_batch=start,
        )  # fmt: skip
        self.train_model.train()
        self.criterion.train()
        params = [p for p in self.train_model.parameters() if p.requires_grad]
        tally = _Tally()
        end = self.per_epoch  # where this epoch stops: its end, or train.max_iters within it
        if t.max_iters is not None:
            end = max(start, min(end, start + t.max_iters - progress.iteration))
        run_end = min(t.epochs * self.per_epoch, t.max_iters or t.epochs * self.per_epoch)  # the run's last iteration
        bar = self.log.progress(total=end, initial=start, desc=f"epoch {epoch}") if self.log else None
        began = last = time.perf_counter()
        batches = iterate_batches(loader)
        try:
            for images, mask, targets in batches:
                data_time = time.perf_counter() - last
                record = train_step(
                    self.train_model, self.criterion, self.optimizer, params, (images, mask, targets),
                    device=self.env.device, amp=self.amp, scaler=self.scaler, clip_max_norm=t.clip_max_norm,
                    iteration=progress.iteration, epoch=epoch,
                )  # fmt: skip
                progress.iteration += 1
                progress.epoch_batches_done += 1
                now = time.perf_counter()
                tally.add(record, targets)
                if self.log is not None:
                    eta = (now - began) / tally.count * max(0, run_end - progress.iteration)  # at this epoch's pace
                    times = {"data_time": round(data_time, 4), "iter_time": round(now - last, 4)}
                    batch = (progress.epoch_batches_done, self.per_epoch)
                    _log_iteration(self.log, bar, record, current_lrs(self.optimizer), epoch=epoch,
                                   iteration=progress.iteration, batch=batch, log_every=t.log_every, times=times,
                                   eta=eta)  # fmt: skip
                last = now
                if self._after_step():
                    break
        except NonFiniteError as exc:
            raise TrainingError(f"{exc}; training stopped and {self._kept()}. Lower train.lr, check the data, "
                                "or keep train.clip_max_norm > 0.") from None  # fmt: skip
        finally:
            batches.close()
            if self.log is not None:
                self.log.close_bar()
        completed = progress.epoch_batches_done >= self.per_epoch
        return EpochStats(epoch, progress.epoch_batches_done, completed, tally.means(), tally.skipped)

    def _after_step(self) -> bool:
        """Ask every hook whether the epoch ends here, then run their ``after_step``; returns the answer."""
        self.halt = any([hook.halt_epoch(self) for hook in self.hooks])  # every hook asked, in every process
        for hook in self.hooks:
            hook.after_step(self)
        return self.halt

    def end_epoch(self, stats: EpochStats) -> None:
        """After an epoch (or the part of it trained): count skipped images, advance the epoch, run the hooks."""
        for ids in all_gather_objects(stats.skipped_image_ids):
            self.progress.skipped_image_ids.update(ids)
        if stats.completed:
            self.progress.epoch, self.progress.epoch_batches_done = stats.epoch + 1, 0
        for hook in self.hooks:
            hook.after_epoch(self, stats)

    def save(self) -> None:
        """Write the training checkpoint (every process takes part: the RNG states are gathered)."""
        rng = all_gather_objects(capture_rng_state(self.env.device))
        on_main(
            self.env,
            lambda: save_training_checkpoint(
                self.ckpt_file, cfg=self.cfg, model=self.model, optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler, grad_scaler=self.scaler, label_map=self.label_map,
                progress=self.progress, rng_states=rng, world_size=self.env.world_size,
                train_images=len(self.train_set), weight_average=self.weight_average,
            ),
        )  # fmt: skip
        if self.config_pending:
            on_main(self.env, lambda: write_config(self.cfg, self.out))
            self.config_pending = False

    def _kept(self) -> str:
        if not self.ckpt_file.is_file():
            return "no checkpoint was written yet"
        return f"the last good checkpoint {self.ckpt_file} (iteration {_stored_iteration(self.ckpt_file)}) is kept"


def _stored_iteration(path: Path) -> str:
    try:
        return str(read_checkpoint(path).extra.get("iteration", "?"))
    except Exception:  # the message is best effort; the file itself was never touched
        return "?"


# --- One iteration ---------------------------------------------------------------------------------------------------


def _to_device(targets: list[dict], device: torch.device) -> list[dict]:
    return [
        {k: (v.to(device, non_blocking=True) if isinstance(v, Tensor) else v) for k, v in t.items()} for t in targets
    ]


def _first_non_finite(terms: dict[str, Tensor], weight_dict: dict[str, float]) -> tuple[str, float] | None:
    for key in weight_dict:
        if key in terms and not math.isfinite(float(terms[key])):
            return key, float(terms[key])
    return None


@dataclass
class _Tally:
    """Sums of the logged values over the iterations of one :meth:`Trainer.train_epoch` call."""

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


def train_step(
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
    """One iteration on ``batch`` = ``(images, mask, targets)``; NonFiniteError on a non-finite loss or gradient norm.

    Returns ``loss`` (the weighted total averaged over processes), the logged terms and ``grad_norm``.
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
    """``(this process's weighted loss, terms averaged over processes)``; NonFiniteError on a non-finite term."""
    weight_dict = criterion.weight_dict
    with autocast(amp, device):
        try:
            outputs = model(images, mask)
        except ValueError as exc:
            too_small_for_norm(exc, images)
            raise
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
    """Backward, clipping, step; returns the norm before clipping (NonFiniteError if not finite, without fp16)."""
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
    """Advance the bar; on the first and every ``log_every``-th iteration write an ``iter`` record and a line."""
    lr = next(iter(lrs.values()))
    log.step(bar, loss=record["loss"], lr=lr)
    if iteration == 1 or iteration % max(log_every, 1) == 0:
        log.write({"type": "iter", "epoch": epoch, "iteration": iteration, "batch": batch[0], **record, **lrs, **times,
                   "eta": round(eta, 2)})  # fmt: skip
        log.line(
            f"epoch {epoch} [{batch[0]}/{batch[1]}] iter {iteration} loss {record['loss']:.4f} lr {lr:.2e} "
            f"grad {record['grad_norm']:.3f} eta {format_duration(eta)}"
        )
