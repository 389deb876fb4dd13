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
   ``train.eval_every`` epochs, every ``train.eval_every_iters`` iterations
   and at the end (each evaluation once per iteration);
5. on SIGINT/SIGTERM: write the checkpoint and raise
   :class:`~detr_peg.engine.signals.TrainingInterrupted`.

Steps 2 and 3 are :func:`~detr_peg.engine.training_run.prepare_training_run`;
this module holds the epoch loop (step 4, with 5) and the end of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.config.schema import Config
from detr_peg.engine.distributed import DistEnv, all_gather_objects, any_process, init_distributed, shutdown_distributed
from detr_peg.engine.evaluation_run import evaluate_and_write
from detr_peg.engine.loader import build_train_loader
from detr_peg.engine.metrics_log import METRICS_FILE
from detr_peg.engine.run_setup import determinism
from detr_peg.engine.signals import TrainingInterrupted
from detr_peg.engine.train_loop import EpochStats, NonFiniteError, train_one_epoch
from detr_peg.engine.training_run import TrainingRun, check_training_ranges, prepare_training_run
from detr_peg.errors import TrainingError
from detr_peg.models.loading import LoadedModel


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
    metrics: dict[str, float] | None = None
    metrics_file: Path | None = None
    detections_file: Path | None = None
    epochs_completed: int = 0
    iterations: int = 0
    skipped_images: int = 0
    losses: dict[str, float] = field(default_factory=dict)
    num_classes: int = 0


def run_training(cfg: Config, *, progress_bars: bool | None = None) -> TrainResult:
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


def _train(cfg: Config, env: DistEnv, progress_bars: bool | None) -> TrainResult:
    """Prepare the run, train epoch by epoch, then end the run (final evaluation and result)."""
    check_training_ranges(cfg, env.device)
    run = prepare_training_run(cfg, env, progress_bars)
    try:
        losses = _train_epochs(run)
        return _end_run(run, losses)
    finally:
        if run.log is not None:
            run.log.close()


# --- The epoch loop ------------------------------------------------------------------------------------------------


def _train_epochs(run: TrainingRun) -> dict[str, float]:
    """Step 4 of the module docstring, with step 5 on a stop request; returns the last epoch's mean losses."""
    losses: dict[str, float] = {}
    with run.stop:
        for epoch in range(run.progress.epoch, run.cfg.train.epochs):
            if run.budget_reached():
                break
            stats = _train_epoch(run, epoch)
            losses = stats.means
            _end_epoch(run, epoch, stats)
    return losses


def _train_epoch(run: TrainingRun, epoch: int) -> EpochStats:
    """Train the rest of ``epoch``, saving every ``train.checkpoint_every`` iterations and halting when asked.

    Raises:
        TrainingError: a non-finite loss or gradient (the last good checkpoint is kept).
    """
    t, progress, device = run.cfg.train, run.progress, run.env.device
    start_batch = progress.epoch_batches_done
    loader = build_train_loader(
        run.train_set,
        run.cfg,
        run.env,
        epoch=epoch,
        size_divisibility=run.model.size_divisibility,
        start_batch=start_batch,
    )

    def after_step(batches_done: int, iteration: int) -> bool:
        progress.epoch_batches_done, progress.iteration = batches_done, iteration
        run.lr_scheduler.step_iteration()
        halt = any_process(run.stop.requested, device) or run.budget_reached()
        if not halt and t.checkpoint_every > 0 and iteration % t.checkpoint_every == 0 and batches_done < run.per_epoch:
            run.save()
        if not halt and t.eval_every_iters > 0 and iteration % t.eval_every_iters == 0:
            _evaluate(run, progress.epoch)  # the epoch in progress
            run.model.train()  # back to training mode for the rest of the epoch
        return halt

    try:
        return train_one_epoch(
            run.train_model,
            run.criterion,
            loader,
            run.optimizer,
            device=device,
            epoch=epoch,
            iteration=progress.iteration,
            batches_done=start_batch,
            batches_per_epoch=run.per_epoch,
            clip_max_norm=t.clip_max_norm,
            amp=run.amp,
            scaler=run.scaler,
            log=run.log,
            log_every=t.log_every,
            after_step=after_step,
        )
    except NonFiniteError as exc:
        ckpt_file = run.ckpt_file
        kept = (
            f"the last good checkpoint {ckpt_file} (iteration {_stored_iteration(ckpt_file)}) is kept"
            if ckpt_file.is_file()
            else "no checkpoint was written yet"
        )
        raise TrainingError(
            f"{exc}; training stopped and {kept}. Lower train.lr, check the data, or keep train.clip_max_norm > 0."
        ) from None


def _end_epoch(run: TrainingRun, epoch: int, stats: EpochStats) -> None:
    """After an epoch (or the part of it trained): step the schedule, save, log, obey a stop request, evaluate.

    Raises:
        TrainingInterrupted: a process received SIGINT or SIGTERM (the checkpoint was written first).
    """
    t, progress = run.cfg.train, run.progress
    for ids in all_gather_objects(stats.skipped_image_ids):
        progress.skipped_image_ids.update(ids)
    if stats.completed:
        run.lr_scheduler.step()
        progress.epoch, progress.epoch_batches_done = epoch + 1, 0
    run.save()
    if run.log is not None:
        run.log.write(
            {
                "type": "epoch",
                "epoch": epoch,
                "iteration": progress.iteration,
                "completed": stats.completed,
                **stats.means,
                "skipped_images": len(progress.skipped_image_ids),
            }
        )
        if progress.skipped_image_ids:
            run.log.info(
                f"{len(progress.skipped_image_ids)} unreadable training images skipped so far "
                "(data.on_bad_sample=skip)."
            )
    if any_process(run.stop.requested, run.env.device):  # every process calls it, so they agree
        raise TrainingInterrupted(
            f"Stopped by {run.stop.name or 'a signal in another process'} at iteration "
            f"{progress.iteration}; the checkpoint {run.ckpt_file} was written; continue with --resume.",
            run.stop.signum or 15,
        )
    last_epoch = progress.epoch >= t.epochs or run.budget_reached()
    if stats.completed and not last_epoch and t.eval_every > 0 and progress.epoch % t.eval_every == 0:
        _evaluate(run, epoch)


def _evaluate(run: TrainingRun, epoch: int) -> None:
    """Evaluate on the validation set (if any), unless this iteration was evaluated already."""
    if run.val_set is not None and run.evaluated_at != run.progress.iteration:
        run.last_eval = evaluate_and_write(
            LoadedModel(run.model, run.postprocessor, run.cfg, run.label_map),
            run.val_set,
            run.cfg,
            run.env,
            run.out,
            run.log,
            extra={"epoch": epoch, "iteration": run.progress.iteration},
            amp=run.amp,
        )
        run.evaluated_at = run.progress.iteration


# --- The end of a run ----------------------------------------------------------------------------------------------


def _end_run(run: TrainingRun, losses: dict[str, float]) -> TrainResult:
    """The final evaluation (with validation data), the result, and the log's ``end`` record."""
    progress, out = run.progress, run.out
    _evaluate(run, progress.epoch)
    last_eval = run.last_eval
    result = TrainResult(
        output_dir=out,
        checkpoint=run.ckpt_file,
        config_file=out / "config.yaml",
        metrics_log=out / METRICS_FILE,
        metrics=last_eval.metrics if last_eval else None,
        metrics_file=last_eval.metrics_file if last_eval else None,
        detections_file=last_eval.detections_file if last_eval else None,
        epochs_completed=progress.epoch,
        iterations=progress.iteration,
        skipped_images=len(progress.skipped_image_ids),
        losses=losses,
        num_classes=run.cfg.model.num_classes,
    )
    if run.log is not None:
        run.log.write(
            {
                "type": "end",
                "epochs_completed": result.epochs_completed,
                "iterations": result.iterations,
                "skipped_images": result.skipped_images,
                "metrics": result.metrics,
            }
        )
        ap = f", AP {result.metrics['AP']:.3f} AP50 {result.metrics['AP50']:.3f}" if result.metrics else ""
        log_line = (
            f"Done: {result.iterations} iterations, {result.epochs_completed} epochs{ap}; "
            f"skipped images: {result.skipped_images}; checkpoint {run.ckpt_file}"
        )
        run.log.info(log_line)
    return result


def _stored_iteration(path: Path) -> str:
    try:
        return str(read_checkpoint(path).extra.get("iteration", "?"))
    except Exception:  # the message is best effort; the file itself was never touched
        return "?"
