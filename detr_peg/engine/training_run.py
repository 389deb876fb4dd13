"""A training run's state (:class:`TrainingRun`) and its preparation (:func:`prepare_training_run`).

:func:`~detr_peg.engine.runner.run_training` prepares a run here, then trains
it epoch by epoch and ends it (:mod:`detr_peg.engine.runner`). The small steps
that evaluation runs share (number of classes, determinism, main-process-only
steps) are in :mod:`detr_peg.engine.run_setup`; this module composes them for
training: the checkpoint to resume, the datasets, the model, criterion and
optimizer, the output folder and its log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.config.loader import save_config
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import CocoDetection, build_coco_dataset
from detr_peg.data.label_map import LabelMap
from detr_peg.engine.checkpointing import (
    CHECKPOINT_NAME,
    Progress,
    check_output_dir,
    checkpoint_path,
    estimate_checkpoint_bytes,
    load_initial_weights,
    restore_training_state,
    save_training_checkpoint,
)
from detr_peg.engine.distributed import DistEnv, all_gather_objects
from detr_peg.engine.evaluation_run import EvalResult
from detr_peg.engine.loader import check_train_size
from detr_peg.engine.lr_schedule import LrSchedule, build_lr_scheduler
from detr_peg.engine.metrics_log import MetricsLog
from detr_peg.engine.mixed_precision import build_grad_scaler, check_amp, resolve_amp
from detr_peg.engine.optimizer import build_optimizer
from detr_peg.engine.run_setup import (
    config_differences,
    on_main,
    resolve_num_classes,
    wrap_sync_batchnorm,
)
from detr_peg.engine.seeding import capture_rng_state, seed_everything
from detr_peg.engine.signals import StopRequest
from detr_peg.errors import ConfigError, TrainingError
from detr_peg.guards.declared_io import train_io
from detr_peg.guards.output_guard import guard_outputs
from detr_peg.guards.resume_rules import RunShape, resume_position, stored_shape
from detr_peg.models.builder import build_criterion, build_model, build_postprocessor
from detr_peg.models.loading import without_backbone_weights


@dataclass
class TrainingRun:
    """Everything the epoch loop and the end of a run use, as the preparation left it.

    ``model`` is the bare detector (checkpoints, evaluation); ``train_model``
    is what the optimizer steps through (``model`` itself, or wrapped in
    DistributedDataParallel and/or ``torch.compile``). ``log`` is None outside
    the main process.
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
    amp: str  # train.amp resolved for the device once (``auto`` -> ``bf16`` or ``none``)
    progress: Progress
    log: MetricsLog | None
    config_pending: bool  # config.yaml still describes the checkpoint being resumed
    stop: StopRequest = field(default_factory=StopRequest)
    last_eval: EvalResult | None = None  # the latest evaluation of this run
    evaluated_at: int = -1  # its iteration, so that no iteration is evaluated twice

    @property
    def ckpt_file(self) -> Path:
        return checkpoint_path(self.out)

    def budget_reached(self) -> bool:
        """``train.max_iters`` iterations are done."""
        return self.cfg.train.max_iters is not None and self.progress.iteration >= self.cfg.train.max_iters

    def save(self) -> None:
        """Write the training checkpoint (every process takes part: the RNG states are gathered)."""
        rng = all_gather_objects(capture_rng_state(self.env.device))
        on_main(
            self.env,
            lambda: save_training_checkpoint(
                self.ckpt_file,
                cfg=self.cfg,
                model=self.model,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                grad_scaler=self.scaler,
                label_map=self.label_map,
                progress=self.progress,
                rng_states=rng,
                world_size=self.env.world_size,
                train_images=len(self.train_set),
            ),
        )
        if self.config_pending:
            on_main(self.env, lambda: _write_config(self.cfg, self.out))
            self.config_pending = False


def check_training_ranges(cfg: Config, device: torch.device) -> None:
    """Refuse mixed precision where it does not exist and epoch or iteration budgets below one."""
    t = cfg.train
    check_amp(t.amp, device)
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be at least 1, got {t.epochs}.")
    if t.max_iters is not None and t.max_iters < 1:
        raise ConfigError(f"train.max_iters must be at least 1 or null, got {t.max_iters}.")
    if t.eval_every_iters < 0:
        raise ConfigError(f"train.eval_every_iters must be 0 (off) or positive, got {t.eval_every_iters}.")


def prepare_training_run(cfg: Config, env: DistEnv, progress_bars: bool | None) -> TrainingRun:
    """Steps 2 and 3 of a run (see :mod:`detr_peg.engine.runner`): checkpoint to resume, data, model, optimizer,
    output folder, log.

    Args:
        cfg: the resolved config; ``model.num_classes`` is filled in from the
            data when unset (the run's ``cfg`` holds the result).
        env: this process.
        progress_bars: show tqdm bars (main process); ``None``: when stderr is
            a terminal.

    Raises:
        UserError: bad data or checkpoint, a checkpoint of another run in the
            output folder, an unwritable or full output folder.
    """
    t, device = cfg.train, env.device
    out = Path(t.output_dir)
    on_main(env, lambda: guard_outputs("train", *train_io(cfg)))
    resume_ckpt = _resume_checkpoint(out, t.resume)
    stored_map = LabelMap.from_dict(resume_ckpt.label_map) if resume_ckpt and resume_ckpt.label_map else None
    train_set = build_coco_dataset(cfg.data, "train", label_map=stored_map)
    label_map = train_set.label_map
    cfg = resolve_num_classes(cfg, label_map, str(train_set.annotation_file))
    val_set = None
    if cfg.data.val_images and cfg.data.val_annotations:
        val_set = build_coco_dataset(cfg.data, "val", label_map=label_map)
    per_epoch = check_train_size(len(train_set), cfg, env.world_size)
    resume_notes: list[str] = []
    if resume_ckpt is not None:
        # Settings that change what the saved position means: converted, or refused before anything is built.
        start_batches, resume_notes = resume_position(
            str(checkpoint_path(out)), stored_shape(resume_ckpt.config, resume_ckpt.extra),
            RunShape(cfg, env.world_size, len(train_set)), int(resume_ckpt.extra.get("epoch", 0)),
            int(resume_ckpt.extra.get("epoch_batches_done", 0)),
        )  # fmt: skip

    model = _build_model(cfg, env, label_map, resumed=resume_ckpt is not None)
    criterion = build_criterion(cfg).to(device)
    postprocessor = build_postprocessor(cfg)
    optimizer = build_optimizer(model, t)
    lr_scheduler = build_lr_scheduler(optimizer, t)
    scaler = build_grad_scaler(t.amp, device)

    on_main(env, lambda: check_output_dir(out, estimate_checkpoint_bytes(model)))
    if resume_ckpt is not None:
        progress = restore_training_state(
            resume_ckpt, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, grad_scaler=scaler,
            rank=env.rank, world_size=env.world_size, device=device,
        )  # fmt: skip
        progress.epoch_batches_done = start_batches
        changed = config_differences(cfg, resume_ckpt.config)
        notes = resume_notes + (
            [f"the config differs from the checkpoint's in: {', '.join(changed[:8])}"] if changed else []
        )
    else:
        progress = Progress()
        seed_everything(t.seed + env.rank)  # model-side randomness (dropout) differs per process
        notes = [f"no checkpoint in {out}; starting a new run"] if t.resume else []
    train_model = _wrap_for_training(model, cfg, env)

    log = on_main(env, lambda: _open_log(cfg, out, progress_bars, append=resume_ckpt is not None))
    if log is not None:
        _announce(log, cfg, env, train_set, val_set, per_epoch, progress, notes, t.batch_size * env.world_size)
    return TrainingRun(
        cfg=cfg, env=env, out=out, train_set=train_set, val_set=val_set, label_map=label_map, per_epoch=per_epoch,
        model=model, train_model=train_model, criterion=criterion, postprocessor=postprocessor, optimizer=optimizer,
        lr_scheduler=lr_scheduler, scaler=scaler, amp=resolve_amp(t.amp, device), progress=progress, log=log,
        config_pending=resume_ckpt is not None,
    )  # fmt: skip


def _resume_checkpoint(out: Path, resume: bool) -> Checkpoint | None:
    """The checkpoint in ``out`` to continue, or None for a new run.

    Raises:
        TrainingError: ``out`` holds a checkpoint but ``train.resume`` is false.
    """
    if not checkpoint_path(out).is_file():
        return None
    if not resume:
        raise TrainingError(
            f"{out} already holds a checkpoint of another run ({CHECKPOINT_NAME}); continue it with --resume "
            "(train.resume=true), or choose another output folder."
        )
    return read_checkpoint(checkpoint_path(out))


def _build_model(cfg: Config, env: DistEnv, label_map: LabelMap, *, resumed: bool) -> nn.Module:
    """The detector on the run's device, with ``train.init_from`` weights loaded (unless resuming)."""
    t = cfg.train
    # The same seed in every process gives every process the same initial weights.
    seed_everything(t.seed)
    starts_from_weights = resumed or t.init_from is not None
    model = build_model(without_backbone_weights(cfg) if starts_from_weights else cfg)
    if t.init_from and not resumed:
        load_initial_weights(
            model,
            t.init_from,
            num_classes=cfg.model.num_classes,
            label_map=label_map,
            reset_classifier=t.reset_classifier,
        )
    return wrap_sync_batchnorm(model, cfg, env).to(env.device)


def _wrap_for_training(model: nn.Module, cfg: Config, env: DistEnv) -> nn.Module:
    """``model`` in DistributedDataParallel when several processes train, then ``torch.compile`` if asked."""
    train_model: nn.Module = model
    if env.distributed:
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if cfg.train.compile:
        train_model = torch.compile(train_model)
    return train_model


def _write_config(cfg: Config, out: Path) -> None:
    try:
        save_config(cfg, out / "config.yaml")
    except OSError as exc:
        raise TrainingError(f"Could not write {out / 'config.yaml'}: {exc.strerror or exc}.") from None


def _open_log(cfg: Config, out: Path, progress_bars: bool | None, append: bool) -> MetricsLog:
    """The run's log; a new run (``append=False``) also writes ``config.yaml`` now."""
    if not append:
        _write_config(cfg, out)
    return MetricsLog(out, tensorboard=cfg.train.tensorboard, progress_bars=progress_bars, append=append)


def _announce(
    log: MetricsLog,
    cfg: Config,
    env: DistEnv,
    train_set,
    val_set,
    per_epoch: int,
    progress: Progress,
    notes: list[str],
    total_batch: int,
) -> None:
    t, m = cfg.train, cfg.model
    log.write(
        {
            "type": "start",
            "world_size": env.world_size,
            "device": str(env.device),
            "batch_size": t.batch_size,
            "total_batch_size": total_batch,
            "iterations_per_epoch": per_epoch,
            "train_images": len(train_set),
            "val_images": len(val_set) if val_set else 0,
            "num_classes": m.num_classes,
            "resumed_epoch": progress.epoch,
            "resumed_iteration": progress.iteration,
        }
    )
    log.info(
        f"Training {m.arch} (position {m.position.name}, backbone {m.backbone.name}) on {len(train_set)} "
        f"images, {m.num_classes} classes, device {env.device}; total batch {total_batch} = "
        f"{t.batch_size} per process x {env.world_size} processes; {per_epoch} iterations per epoch."
    )
    if t.total_batch_size is not None and t.total_batch_size != total_batch:
        log.info(
            f"Note: the recipe's total batch is {t.total_batch_size} but this run's is {total_batch}; "
            f"consider train.lr={t.lr * total_batch / t.total_batch_size:.3g} and "
            f"train.lr_backbone={t.lr_backbone * total_batch / t.total_batch_size:.3g} (linear scaling)."
        )
    if train_set.num_invalid_skipped:
        log.info(f"{train_set.num_invalid_skipped} invalid annotations skipped in {train_set.annotation_file}.")
    if train_set.num_boxes_outside:
        log.info(
            f"{train_set.num_boxes_outside} boxes in {train_set.annotation_file} lie entirely outside their "
            "image and are left out of the training targets."
        )
    if progress.iteration:
        log.info(
            f"Resumed at epoch {progress.epoch}, batch {progress.epoch_batches_done}, iteration {progress.iteration}."
        )
    for note in notes:
        log.info(f"Note: {note}.")
