"""A training run: :func:`run_training` from a resolved config to a trained checkpoint (in every process)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.checkpoint.resume_rules import RunShape, resume_position, stored_shape
from detr_peg.config.loader import checked_config, config_differences
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
    seed_everything,
    write_config,
)
from detr_peg.engine.distributed import DistEnv, on_main, process_group
from detr_peg.engine.evaluation.metric_units import UNIT, format_percent
from detr_peg.engine.evaluation.per_class import CONFUSION_JSON, PER_CLASS_CSV
from detr_peg.engine.hooks import BEST_CHECKPOINT, EvalHook, default_hooks
from detr_peg.engine.loader import check_train_size
from detr_peg.engine.metrics_log import METRICS_FILE, MetricsLog
from detr_peg.engine.mixed_precision import build_grad_scaler, check_amp, resolve_amp
from detr_peg.engine.optimizer import build_lr_scheduler, build_optimizer
from detr_peg.engine.run_hints import low_ap_note
from detr_peg.engine.trainer import HookBase, Trainer
from detr_peg.engine.weight_average import WeightAverage
from detr_peg.errors import ConfigError, TrainingError
from detr_peg.models.builder import TORCH_STATE, build_criterion, build_model, build_postprocessor, torch_defaults
from detr_peg.models.loading import checkpoint_label_map, resolve_num_classes, without_backbone_weights
from detr_peg.models.position.peg import PEG
from detr_peg.outputs import Output, guard_outputs, inputs

#: What a training run writes into ``train.output_dir``.
RUN_NAMES = ("checkpoint.pth", "config.yaml", "metrics.jsonl", "metrics.json", "detections.json", PER_CLASS_CSV,
             CONFUSION_JSON, BEST_CHECKPOINT)  # fmt: skip


@dataclass
class TrainResult:
    """What :func:`run_training` produced; ``metrics`` (percent) is the last evaluation, None without validation data.

    ``epochs_completed`` and ``iterations`` are totals; ``losses`` are the means of the last epoch (or part) trained.
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


def run_training(
    cfg: Config, *, progress_bars: bool | None = None, hooks: Sequence[HookBase] | None = None
) -> TrainResult:
    """Train (or resume training) as ``cfg`` says; returns the :class:`TrainResult` in every process.

    ``progress_bars=None`` shows bars when stderr is a terminal; ``hooks`` defaults to
    :func:`~detr_peg.engine.hooks.default_hooks`.

    Raises:
        UserError: bad config, data or checkpoint, an unwritable or full output folder, a non-finite loss,
            or a stop request (:class:`~detr_peg.engine.hooks.TrainingInterrupted`).
    """
    cfg = checked_config(cfg, "run_training's config")  # a Config made in Python meets the ranges
    with (
        TORCH_STATE,  # runs in threads take turns
        torch.inference_mode(False), torch.enable_grad(), torch_defaults(),  # whatever the caller's torch state
        callers_random_states(),
        process_group(cfg.train.device) as env, determinism(cfg, env.device), contextlib.ExitStack() as claims,
    ):  # fmt: skip
        check_amp(cfg.train.amp, env.device)
        out, io = Path(cfg.train.output_dir), _train_io(cfg)
        new = [out / name for name in io[1][0].names if not os.path.lexists(out / name)]
        owned = on_main(env, lambda: guard_outputs("train", *io))
        if owned is not None:
            claims.enter_context(owned)  # settled when the run ends, well or not
            claims.push(lambda failed, *_: _discard_unstarted(out, new) if failed else None)
        trainer = Trainer(**build_training(cfg, env, progress_bars), hooks=default_hooks() if hooks is None else hooks)
        try:
            return _result(trainer, trainer.train())
        finally:
            if trainer.log is not None:
                trainer.log.close()


def _discard_unstarted(out: Path, new: list[Path]) -> None:
    """Remove the files ``new`` to a run that failed before its first checkpoint (it has nothing to resume)."""
    if not (out / CHECKPOINT_NAME).exists():
        for path in new:
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def _train_io(cfg: Config) -> tuple:
    """The data, ``train.init_from`` and backbone weights in; the run folder out (adopted by ``--resume``)."""
    t, weights = cfg.train, cfg.model.backbone.weights
    reads = inputs(*cfg.data.files(), (t.init_from, "train.init_from"), (weights, "model.backbone.weights"))
    names = RUN_NAMES + (("tensorboard",) if t.tensorboard else ())
    return reads, [Output(t.output_dir, "train.output_dir", names, adopt=t.resume)]


def _result(trainer: Trainer, losses: dict[str, float]) -> TrainResult:
    """The run's :class:`TrainResult`, and the log's ``end`` record."""
    progress, out = trainer.progress, trainer.out
    evaluation = next((hook.last for hook in trainer.hooks if isinstance(hook, EvalHook)), None)
    result = TrainResult(
        output_dir=out, checkpoint=trainer.ckpt_file, config_file=out / "config.yaml",
        metrics_log=out / METRICS_FILE, metrics=evaluation.metrics if evaluation else None,
        metrics_file=evaluation.metrics_file if evaluation else None,
        detections_file=evaluation.detections_file if evaluation else None, epochs_completed=progress.epoch,
        iterations=progress.iteration, skipped_images=len(progress.skipped_image_ids), losses=losses,
        num_classes=trainer.cfg.model.num_classes,
    )  # fmt: skip
    log = trainer.log
    if log is not None:
        log.write({"type": "end", "epochs_completed": result.epochs_completed, "iterations": result.iterations,
                   "skipped_images": result.skipped_images, "metrics": result.metrics, "unit": UNIT})  # fmt: skip
        ap = (f", AP {format_percent(result.metrics['AP'])} AP50 {format_percent(result.metrics['AP50'])}"
              if result.metrics else "")  # fmt: skip
        log.info(
            f"Done: {result.iterations} iterations, {result.epochs_completed} epochs{ap}; "
            f"skipped images: {result.skipped_images}; checkpoint {trainer.ckpt_file}"
        )
        final_ap = result.metrics.get("AP") if result.metrics else None
        note = low_ap_note(final_ap, result.iterations, from_scratch=not trainer.cfg.train.init_from)
        if note:
            log.info(note)
    return result


def build_training(cfg: Config, env: DistEnv, progress_bars: bool | None) -> dict[str, Any]:
    """Keyword arguments of ``cfg``'s :class:`~detr_peg.engine.trainer.Trainer` (their ``cfg`` has ``num_classes``).

    A resumed run rewrites ``config.yaml`` only at its first checkpoint: an early failure leaves the folder as it was.
    """
    t, device = cfg.train, env.device
    out = Path(t.output_dir)
    resume_ckpt = _resume_checkpoint(out, t.resume)
    stored_map = checkpoint_label_map(resume_ckpt, resume_ckpt.config) if resume_ckpt else None
    train_set = build_coco_dataset(cfg.data, "train", label_map=stored_map)
    label_map = train_set.label_map
    model_cfg = resolve_num_classes(
        cfg.model, label_map, str(train_set.annotation_file), categories=train_set.coco.dataset["categories"]
    )
    cfg = replace(cfg, model=model_cfg)
    val_set = None
    if cfg.data.val_images and cfg.data.val_annotations:
        val_set = build_coco_dataset(cfg.data, "val", label_map=label_map)
    per_epoch = check_train_size(len(train_set), t.batch_size, env.world_size)
    model = _build_model(cfg, env, label_map, resumed=resume_ckpt is not None)
    optimizer = build_optimizer(model, t)
    lr_scheduler = build_lr_scheduler(optimizer, t)
    scaler = build_grad_scaler(t.amp, device)
    weight_average = (
        WeightAverage(model, decay=t.ema_decay, warmup_iters=t.ema_warmup_iters) if t.ema_decay > 0 else None
    )
    on_main(env, lambda: check_output_dir(out, estimate_checkpoint_bytes(model)))
    if resume_ckpt is not None:
        progress, notes = _resume(
            resume_ckpt, cfg, env, len(train_set), model, optimizer, lr_scheduler, scaler, weight_average
        )
    else:
        progress = Progress()
        seed_everything(t.seed + env.rank)  # model-side randomness (dropout) differs per process
        notes = [f"no checkpoint in {out}; starting a new run"] if t.resume else []
    progress.skipped_image_ids.update(train_set.left_out_ids)  # left out when the annotations were read
    notes = [*notes, *idle_settings(cfg, val_set is not None), *crowded_images(train_set, cfg.model.num_queries)]
    if t.max_iters is not None and progress.iteration >= t.max_iters:
        notes.append(f"train.max_iters={t.max_iters} was reached before (the checkpoint is at iteration "
                     f"{progress.iteration}): nothing is left to train")  # fmt: skip
    log = on_main(env, lambda: _open_log(cfg, out, progress_bars, append=resume_ckpt is not None))
    if log is not None:
        _announce(log, cfg, env, train_set, val_set, per_epoch, progress, notes, t.batch_size * env.world_size)
    return dict(
        cfg=cfg, env=env, out=out, train_set=train_set, val_set=val_set, label_map=label_map, per_epoch=per_epoch,
        model=model, train_model=_wrap_for_training(model, cfg, env), criterion=build_criterion(cfg).to(device),
        postprocessor=build_postprocessor(cfg), optimizer=optimizer, lr_scheduler=lr_scheduler, scaler=scaler,
        amp=resolve_amp(t.amp, device), progress=progress, log=log, config_pending=resume_ckpt is not None,
        weight_average=weight_average,
    )  # fmt: skip


def _resume(
    ckpt: Checkpoint,
    cfg: Config,
    env: DistEnv,
    train_images: int,
    model,
    optimizer,
    lr_scheduler,
    scaler,
    weight_average: WeightAverage | None,
) -> tuple[Progress, list[str]]:
    """Restore ``ckpt``'s state: ``(progress, notes for the log)``; settings that move the position are converted."""
    out = Path(cfg.train.output_dir)
    start_batches, notes = resume_position(
        str(checkpoint_path(out)), stored_shape(ckpt.config, ckpt.extra),
        RunShape(cfg, env.world_size, train_images), int(ckpt.extra.get("epoch", 0)),
        int(ckpt.extra.get("epoch_batches_done", 0)),
    )  # fmt: skip
    progress = restore_training_state(
        ckpt, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, grad_scaler=scaler,
        rank=env.rank, world_size=env.world_size, device=env.device, weight_average=weight_average, config=cfg,
    )  # fmt: skip
    progress.epoch_batches_done = start_batches
    changed = config_differences(cfg, ckpt.config)
    if changed:
        notes = [*notes, f"the config differs from the checkpoint's in: {', '.join(changed[:8])}"]
    return progress, notes


@contextlib.contextmanager
def callers_random_states() -> Iterator[None]:
    """Python's, NumPy's and torch's global generators as they were before the block: a run seeds them itself."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


@contextlib.contextmanager
def determinism(cfg: Config, device: torch.device) -> Iterator[None]:
    """``train.deterministic``: deterministic kernels (warn where none exists), no cuDNN autotuning; undone on exit."""
    if not cfg.train.deterministic:
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    if device.type == "cuda":
        # cuBLAS needs this before its first use to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.benchmark = previous[2]


def wrap_sync_batchnorm(model: nn.Module, cfg: Config, env: DistEnv) -> nn.Module:
    """BatchNorm to ``SyncBatchNorm`` for ``model.backbone.norm=sync_bn`` on several processes, except the PEG's.

    The PEG's masked statistics over unpadded tokens (:func:`~detr_peg.models.position.peg.masked_batch_norm`)
    are not what ``SyncBatchNorm`` computes, so they stay per process.
    """
    if cfg.model.backbone.norm == "sync_bn" and env.distributed:
        if env.device.type != "cuda":  # torch's SyncBatchNorm, and DDP around it, run on CUDA only
            raise ConfigError(f"model.backbone.norm=sync_bn synchronises BatchNorm over CUDA devices only, not "
                              f"{env.device.type}; use model.backbone.norm=bn (statistics per process) or frozen_bn.")  # fmt: skip
        return _convert_except_peg(model)
    return model


def _convert_except_peg(module: nn.Module) -> nn.Module:
    if isinstance(module, (PEG, nn.SyncBatchNorm)):  # the PEG's masked statistics; already synchronised
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in module.named_children():
        converted = _convert_except_peg(child)
        if converted is not child:
            setattr(module, name, converted)
    return module


def _resume_checkpoint(out: Path, resume: bool) -> Checkpoint | None:
    """The checkpoint in ``out`` to continue, or None; TrainingError for one without ``train.resume``, or a non-file."""
    path = checkpoint_path(out)
    if os.path.lexists(path) and not path.is_file():
        raise TrainingError(
            f"{path} is not a regular file (a folder, a broken link or a device); move it away to start a new "
            "run, or restore the checkpoint to continue this one."
        )
    if not path.is_file():
        return None
    if not resume:
        raise TrainingError(
            f"{out} already holds the checkpoint of a training run ({CHECKPOINT_NAME}); continue that run with "
            "--resume (train.resume=true; in Python, overrides=['train.resume=true'] of Detector.fine_tune or "
            "load_config), or choose another output folder."
        )
    return read_checkpoint(checkpoint_path(out))


def _build_model(cfg: Config, env: DistEnv, label_map: LabelMap, *, resumed: bool) -> nn.Module:
    """The detector on the run's device, with ``train.init_from`` weights loaded (unless resuming)."""
    t = cfg.train
    # The same seed in every process gives every process the same initial weights.
    seed_everything(t.seed)
    starts_from_weights = resumed or t.init_from is not None
    model = build_model(without_backbone_weights(cfg.model) if starts_from_weights else cfg.model)
    if t.init_from and not resumed:
        load_initial_weights(
            model,
            t.init_from,
            num_classes=cfg.model.num_classes,
            label_map=label_map,
            reset_classifier=t.reset_classifier,
            position=cfg.model.position.name,
            arch=cfg.model.arch,
            config=cfg,
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


def idle_settings(cfg: Config, has_val: bool) -> list[str]:
    """Notes on settings this run cannot act on (each would otherwise do nothing without a word)."""
    t, notes = cfg.train, []
    if t.save_best and not has_val:
        notes.append(f"train.save_best={t.save_best} writes no checkpoint_best.pth: the run has no validation data")
    if t.early_stop and not has_val:
        notes.append(f"train.early_stop={t.early_stop} cannot end the run: it has no validation data")
    elif t.early_stop and t.eval_every_iters == 0 and (t.eval_every == 0 or t.eval_every >= t.epochs):
        notes.append(f"train.early_stop={t.early_stop} cannot end the run: it evaluates only at the end (set "
                     "train.eval_every or train.eval_every_iters)")  # fmt: skip
    if t.reset_classifier and not t.init_from:
        notes.append("train.reset_classifier=true does nothing without train.init_from")
    if t.lr == 0 and t.lr_backbone == 0:
        notes.append("train.lr and train.lr_backbone are 0: the weights do not change")
    if t.warmup_iters and t.max_iters and t.warmup_iters >= t.max_iters:
        notes.append(f"train.warmup_iters={t.warmup_iters} is not shorter than the run (train.max_iters="
                     f"{t.max_iters}): the learning rate never reaches train.lr")  # fmt: skip
    return notes


def crowded_images(dataset: CocoDetection, num_queries: int) -> list[str]:
    """A note when images hold more objects than the model has queries: the matcher cannot reach the rest."""
    over = [n for anns in dataset.coco.imgToAnns.values() if (n := sum(not a["iscrowd"] for a in anns)) > num_queries]
    return [f"{len(over)} training images hold more objects than model.num_queries={num_queries} (up to {max(over)}); "
            "the others are never matched: raise model.num_queries"] if over else []  # fmt: skip


def _open_log(cfg: Config, out: Path, progress_bars: bool | None, append: bool) -> MetricsLog:
    """The run's log; a new run (``append=False``) also writes ``config.yaml`` now."""
    if not append:
        write_config(cfg, out)
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
    if not train_set.coco.anns:
        log.info(f"Note: {train_set.annotation_file} holds no boxes; the run learns that the images hold no object.")
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
