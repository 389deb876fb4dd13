"""Whole training runs: :func:`run_training` from a config to a trained checkpoint and its metrics.

The command line (``detr-peg train``), ``tools/train.py`` and the demo all
call :func:`run_training`; under ``torchrun`` every process calls it and the
processes find each other from the environment.

Order of a run:

1. join the process group (if any), pick the device, refuse mixed precision on the CPU;
2. read the resume checkpoint (``train.resume``: ``<output_dir>/checkpoint.pth``
   if it exists) and the datasets; the label map comes from the checkpoint
   when resuming, else from the training annotations, and gives
   ``model.num_classes`` when it is unset;
3. build the model with the same seed in every process, load
   ``train.init_from`` weights, check that the output folder is writable and
   has room for a checkpoint, then write ``config.yaml`` (a resumed run
   replaces it right after its first checkpoint, so a resume that fails
   before that leaves the folder as it was);
4. train epoch by epoch (see :mod:`detr_peg.engine.train_loop`) until
   ``train.epochs`` or exactly ``train.max_iters`` iterations, writing the
   checkpoint atomically after every epoch (and every
   ``train.checkpoint_every`` iterations), evaluating every
   ``train.eval_every`` epochs and at the end;
5. on SIGINT/SIGTERM: write the checkpoint and raise
   :class:`~detr_peg.engine.signals.TrainingInterrupted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.config.loader import save_config
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import build_coco_dataset
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
from detr_peg.engine.distributed import DistEnv, all_gather_objects, any_process, init_distributed, shutdown_distributed
from detr_peg.engine.evaluation_run import evaluate_and_write
from detr_peg.engine.loader import build_train_loader, check_train_size
from detr_peg.engine.metrics_log import METRICS_FILE, MetricsLog
from detr_peg.engine.optim import build_grad_scaler, build_lr_scheduler, build_optimizer, check_amp
from detr_peg.engine.run_setup import (
    config_differences,
    determinism,
    on_main,
    resolve_num_classes,
    without_backbone_weights,
    wrap_sync_batchnorm,
)
from detr_peg.engine.seeding import capture_rng_state, seed_everything
from detr_peg.engine.signals import StopRequest, TrainingInterrupted
from detr_peg.engine.train_loop import NonFiniteError, train_one_epoch
from detr_peg.errors import ConfigError, TrainingError


@dataclass
class TrainResult:
    """What :func:`run_training` produced.

    Attributes:
        output_dir: the run's folder.
        checkpoint: the last checkpoint (``checkpoint.pth``).
        config_file: the resolved config (``config.yaml``).
        metrics_log: the JSON-lines log (``metrics.jsonl``).
        metrics: the last COCO evaluation (``AP``, ``AP50``, ...), or None
            without validation data.
        metrics_file: ``metrics.json`` of the last evaluation, or None.
        detections_file: ``detections.json`` of the last evaluation, or None.
        epochs_completed: whole epochs trained in total.
        iterations: optimizer steps done in total.
        skipped_images: unreadable training images left out
            (``data.on_bad_sample=skip``), all processes together.
        losses: the means of the last epoch (or part of it) trained.
        num_classes: the model's number of classes.
    """

    output_dir: Path
    checkpoint: Path
    config_file: Path
    metrics_log: Path
    metrics: Optional[dict[str, float]] = None
    metrics_file: Optional[Path] = None
    detections_file: Optional[Path] = None
    epochs_completed: int = 0
    iterations: int = 0
    skipped_images: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    num_classes: int = 0


def run_training(cfg: Config, *, progress_bars: Optional[bool] = None) -> TrainResult:
    """Train (or resume training) as ``cfg`` says; see the module docstring.

    Args:
        cfg: the resolved config (``load_config``).
        progress_bars: show tqdm bars (main process); ``None``: when stderr is
            a terminal.

    Returns:
        :class:`TrainResult` (in every process; files are written by the
        main process).

    Raises:
        UserError: bad config, data or checkpoint, an unwritable output
            folder, a full disk (:class:`~detr_peg.errors.TrainingError`), a
            non-finite loss or gradient, or a stop request
            (:class:`~detr_peg.engine.signals.TrainingInterrupted`).
    """
    owns_group = not (dist.is_available() and dist.is_initialized())
    env = init_distributed(cfg.train.device)
    try:
        with determinism(cfg, env.device):
            return _train(cfg, env, progress_bars)
    finally:
        if owns_group:
            shutdown_distributed()


def _train(cfg: Config, env: DistEnv, progress_bars: Optional[bool]) -> TrainResult:
    t = cfg.train
    device = env.device
    check_amp(t.amp, device)
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be at least 1, got {t.epochs}.")
    if t.max_iters is not None and t.max_iters < 1:
        raise ConfigError(f"train.max_iters must be at least 1 or null, got {t.max_iters}.")
    out = Path(t.output_dir)

    resume_ckpt = None
    if checkpoint_path(out).is_file():
        if not t.resume:
            raise TrainingError(
                f"{out} already holds a checkpoint of another run ({CHECKPOINT_NAME}); continue it with --resume "
                "(train.resume=true), or choose another output folder."
            )
        resume_ckpt = read_checkpoint(checkpoint_path(out))
    stored_map = LabelMap.from_dict(resume_ckpt.label_map) if resume_ckpt and resume_ckpt.label_map else None
    train_set = build_coco_dataset(cfg.data, "train", label_map=stored_map)
    label_map = train_set.label_map
    cfg = resolve_num_classes(cfg, label_map, str(train_set.annotation_file))
    val_set = None
    if cfg.data.val_images and cfg.data.val_annotations:
        val_set = build_coco_dataset(cfg.data, "val", label_map=label_map)
    per_epoch = check_train_size(len(train_set), cfg, env.world_size)

    # The same seed in every process gives every process the same initial weights.
    seed_everything(t.seed)
    from detr_peg.models.builder import build_criterion, build_model, build_postprocessor

    starts_from_weights = resume_ckpt is not None or t.init_from is not None
    model = build_model(without_backbone_weights(cfg) if starts_from_weights else cfg)
    if t.init_from and resume_ckpt is None:
        load_initial_weights(model, t.init_from, num_classes=cfg.model.num_classes, label_map=label_map,
                             reset_classifier=t.reset_classifier)
    model = wrap_sync_batchnorm(model, cfg, env).to(device)
    criterion = build_criterion(cfg).to(device)
    postprocessor = build_postprocessor(cfg)
    optimizer = build_optimizer(model, t)
    lr_scheduler = build_lr_scheduler(optimizer, t)
    scaler = build_grad_scaler(t.amp, device)

    on_main(env, lambda: check_output_dir(out, estimate_checkpoint_bytes(model)))
    notes: list[str] = []
    if resume_ckpt is not None:
        progress = restore_training_state(resume_ckpt, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler,
                                          grad_scaler=scaler, rank=env.rank, world_size=env.world_size,
                                          device=device)
        changed = config_differences(cfg, resume_ckpt.config)
        if changed:
            notes.append(f"the config differs from the checkpoint's in: {', '.join(changed[:8])}")
    else:
        progress = Progress()
        seed_everything(t.seed + env.rank)  # model-side randomness (dropout) differs per process
        if t.resume:
            notes.append(f"no checkpoint in {out}; starting a new run")

    train_model: torch.nn.Module = model
    if env.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if t.compile:
        train_model = torch.compile(train_model)

    log = on_main(env, lambda: _open_log(cfg, out, progress_bars, append=resume_ckpt is not None))
    total_batch = t.batch_size * env.world_size
    if log is not None:
        _announce(log, cfg, env, train_set, val_set, per_epoch, progress, notes, total_batch)

    ckpt_file = checkpoint_path(out)
    config_pending = resume_ckpt is not None  # config.yaml still describes the checkpoint being resumed

    def save() -> None:
        nonlocal config_pending
        rng = all_gather_objects(capture_rng_state(device))
        on_main(env, lambda: save_training_checkpoint(
            ckpt_file, cfg=cfg, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, grad_scaler=scaler,
            label_map=label_map, progress=progress, rng_states=rng, world_size=env.world_size))
        if config_pending:
            on_main(env, lambda: _write_config(cfg, out))
            config_pending = False

    def budget_reached() -> bool:
        return t.max_iters is not None and progress.iteration >= t.max_iters

    last_eval = None
    losses: dict[str, float] = {}
    stop = StopRequest()
    try:
        with stop:
            for epoch in range(progress.epoch, t.epochs):
                if budget_reached():
                    break
                start_batch = progress.epoch_batches_done
                loader = build_train_loader(train_set, cfg, env, epoch=epoch, start_batch=start_batch)

                def after_step(batches_done: int, iteration: int) -> bool:
                    progress.epoch_batches_done, progress.iteration = batches_done, iteration
                    halt = any_process(stop.requested, device) or budget_reached()
                    if (not halt and t.checkpoint_every > 0 and iteration % t.checkpoint_every == 0
                            and batches_done < per_epoch):
                        save()
                    return halt

                try:
                    stats = train_one_epoch(
                        train_model, criterion, loader, optimizer, device=device, epoch=epoch,
                        iteration=progress.iteration, batches_done=start_batch, batches_per_epoch=per_epoch,
                        clip_max_norm=t.clip_max_norm, amp=t.amp, scaler=scaler, log=log, log_every=t.log_every,
                        after_step=after_step)
                except NonFiniteError as exc:
                    kept = (f"the last good checkpoint {ckpt_file} (iteration {_stored_iteration(ckpt_file)}) is "
                            "kept" if ckpt_file.is_file() else "no checkpoint was written yet")
                    raise TrainingError(
                        f"{exc}; training stopped and {kept}. Lower train.lr, check the data, or keep "
                        "train.clip_max_norm > 0."
                    ) from None
                losses = stats.means
                for ids in all_gather_objects(stats.skipped_image_ids):
                    progress.skipped_image_ids.update(ids)
                if stats.completed:
                    lr_scheduler.step()
                    progress.epoch, progress.epoch_batches_done = epoch + 1, 0
                save()
                if log is not None:
                    log.write({"type": "epoch", "epoch": epoch, "iteration": progress.iteration,
                               "completed": stats.completed, **losses,
                               "skipped_images": len(progress.skipped_image_ids)})
                    if progress.skipped_image_ids:
                        log.info(f"{len(progress.skipped_image_ids)} unreadable training images skipped so far "
                                 "(data.on_bad_sample=skip).")
                if any_process(stop.requested, device):  # every process calls it, so they agree
                    raise TrainingInterrupted(
                        f"Stopped by {stop.name or 'a signal in another process'} at iteration "
                        f"{progress.iteration}; the checkpoint {ckpt_file} was written; continue with --resume.",
                        stop.signum or 15)
                last_epoch = progress.epoch >= t.epochs or budget_reached()
                if (val_set is not None and stats.completed and not last_epoch and t.eval_every > 0
                        and progress.epoch % t.eval_every == 0):
                    last_eval = evaluate_and_write(model, postprocessor, val_set, cfg, env, out, log,
                                                   extra={"epoch": epoch, "iteration": progress.iteration})
        if val_set is not None:
            last_eval = evaluate_and_write(model, postprocessor, val_set, cfg, env, out, log,
                                           extra={"epoch": progress.epoch, "iteration": progress.iteration})
        result = TrainResult(
            output_dir=out, checkpoint=ckpt_file, config_file=out / "config.yaml", metrics_log=out / METRICS_FILE,
            metrics=last_eval.metrics if last_eval else None,
            metrics_file=last_eval.metrics_file if last_eval else None,
            detections_file=last_eval.detections_file if last_eval else None,
            epochs_completed=progress.epoch, iterations=progress.iteration,
            skipped_images=len(progress.skipped_image_ids), losses=losses, num_classes=cfg.model.num_classes)
        if log is not None:
            log.write({"type": "end", "epochs_completed": result.epochs_completed, "iterations": result.iterations,
                       "skipped_images": result.skipped_images, "metrics": result.metrics})
            ap = f", AP {result.metrics['AP']:.3f} AP50 {result.metrics['AP50']:.3f}" if result.metrics else ""
            log.info(f"Done: {result.iterations} iterations, {result.epochs_completed} epochs{ap}; "
                     f"skipped images: {result.skipped_images}; checkpoint {ckpt_file}")
    finally:
        if log is not None:
            log.close()
    return result


def _stored_iteration(path: Path) -> str:
    try:
        return str(read_checkpoint(path).extra.get("iteration", "?"))
    except Exception:  # the message is best effort; the file itself was never touched
        return "?"


def _write_config(cfg: Config, out: Path) -> None:
    try:
        save_config(cfg, out / "config.yaml")
    except OSError as exc:
        raise TrainingError(f"Could not write {out / 'config.yaml'}: {exc.strerror or exc}.") from None


def _open_log(cfg: Config, out: Path, progress_bars: Optional[bool], append: bool) -> MetricsLog:
    """The run's log; a new run (``append=False``) also writes ``config.yaml`` now."""
    if not append:
        _write_config(cfg, out)
    return MetricsLog(out, tensorboard=cfg.train.tensorboard, progress_bars=progress_bars, append=append)


def _announce(log: MetricsLog, cfg: Config, env: DistEnv, train_set, val_set, per_epoch: int, progress: Progress,
              notes: list[str], total_batch: int) -> None:
    t, m = cfg.train, cfg.model
    log.write({"type": "start", "world_size": env.world_size, "device": str(env.device),
               "batch_size": t.batch_size, "total_batch_size": total_batch, "iterations_per_epoch": per_epoch,
               "train_images": len(train_set), "val_images": len(val_set) if val_set else 0,
               "num_classes": m.num_classes, "resumed_epoch": progress.epoch,
               "resumed_iteration": progress.iteration})
    log.info(f"Training {m.arch} (position {m.position.name}, backbone {m.backbone.name}) on {len(train_set)} "
             f"images, {m.num_classes} classes, device {env.device}; total batch {total_batch} = "
             f"{t.batch_size} per process x {env.world_size} processes; {per_epoch} iterations per epoch.")
    if t.total_batch_size is not None and t.total_batch_size != total_batch:
        log.info(f"Note: the recipe's total batch is {t.total_batch_size} but this run's is {total_batch}; "
                 f"consider train.lr={t.lr * total_batch / t.total_batch_size:.3g} and "
                 f"train.lr_backbone={t.lr_backbone * total_batch / t.total_batch_size:.3g} (linear scaling).")
    if train_set.num_invalid_skipped:
        log.info(f"{train_set.num_invalid_skipped} invalid annotations skipped in {train_set.annotation_file}.")
    if train_set.num_boxes_outside:
        log.info(f"{train_set.num_boxes_outside} boxes in {train_set.annotation_file} lie entirely outside their "
                 "image and are left out of the training targets.")
    if progress.iteration:
        log.info(f"Resumed at epoch {progress.epoch}, batch {progress.epoch_batches_done}, "
                 f"iteration {progress.iteration}.")
    for note in notes:
        log.info(f"Note: {note}.")

