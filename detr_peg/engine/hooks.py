"""The default training hooks (:func:`default_hooks`): schedule, average, budget, checkpoint, log, signals, eval,
best checkpoint and early stop."""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType

from detr_peg.checkpoint.format import save_checkpoint
from detr_peg.config.ranges import is_number
from detr_peg.engine.distributed import any_process, on_main
from detr_peg.engine.evaluation.metric_units import read_metrics
from detr_peg.engine.evaluation.run import EvalResult, evaluate_and_write
from detr_peg.engine.metrics_log import METRICS_FILE, log_records
from detr_peg.engine.trainer import EpochStats, HookBase, Trainer
from detr_peg.errors import Terminated, TrainingError
from detr_peg.models.loading import LoadedModel

#: Where ``train.save_best`` keeps the best evaluated weights, in the run folder.
BEST_CHECKPOINT = "checkpoint_best.pth"


class LrScheduleHook(HookBase):
    """Steps :class:`~detr_peg.engine.optimizer.LrSchedule`: warm-up per iteration, drop per completed epoch."""

    def after_step(self, trainer: Trainer) -> None:
        trainer.lr_scheduler.step_iteration()

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        if stats.completed:
            trainer.lr_scheduler.step()


class TrainingInterrupted(TrainingError):
    """Training stopped on a signal after writing a checkpoint; ``exit_code`` is ``128 + signal number``."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


#: The signals that request a stop.
HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The first SIGINT/SIGTERM becomes a stop request (``signum``), a second stops at once; no-op off the main thread."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


class StopSignalHook(HookBase):
    """A stop request in any process ends the epoch; after its checkpoint, :class:`TrainingInterrupted` is raised."""

    def __init__(self) -> None:
        self.stop = StopRequest()

    def context(self, trainer: Trainer) -> contextlib.AbstractContextManager:
        return self.stop

    def halt_epoch(self, trainer: Trainer) -> bool:
        return any_process(self.stop.requested, trainer.env.device)

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        """Raise :class:`TrainingInterrupted` when any process was asked to stop."""
        if any_process(self.stop.requested, trainer.env.device):
            raise TrainingInterrupted(
                f"Stopped by {self.stop.name or 'a signal in another process'} at iteration "
                f"{trainer.progress.iteration}; the checkpoint {trainer.ckpt_file} was written; continue with "
                "--resume.",
                self.stop.signum or 15,
            )


class WeightAverageHook(HookBase):
    """``train.ema_decay``: update the weight average after every step, before that step's checkpoint and evaluation."""

    def after_step(self, trainer: Trainer) -> None:
        if trainer.weight_average is not None:
            trainer.weight_average.update(trainer.model)


class BudgetHook(HookBase):
    """``train.max_iters``: the run ends after exactly that many iterations (mid-epoch if need be)."""

    def stop_training(self, trainer: Trainer) -> bool:
        limit = trainer.cfg.train.max_iters
        return limit is not None and trainer.progress.iteration >= limit

    def halt_epoch(self, trainer: Trainer) -> bool:
        return self.stop_training(trainer)


class CheckpointHook(HookBase):
    """Checkpoint after every epoch (or part) and every ``train.checkpoint_every`` steps, unless the epoch ends now."""

    def after_step(self, trainer: Trainer) -> None:
        every = trainer.cfg.train.checkpoint_every
        progress = trainer.progress
        if (
            not trainer.halt
            and every > 0
            and progress.iteration % every == 0
            and progress.epoch_batches_done < trainer.per_epoch
        ):
            trainer.save()

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        trainer.save()


class EpochLogHook(HookBase):
    """The ``epoch`` record of ``metrics.jsonl`` (mean losses, skipped images) and a note on skipped images."""

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        log, progress = trainer.log, trainer.progress
        if log is None:
            return
        log.write(
            {
                "type": "epoch",
                "epoch": stats.epoch,
                "iteration": progress.iteration,
                "completed": stats.completed,
                **stats.means,
                "skipped_images": len(progress.skipped_image_ids),
            }
        )
        if progress.skipped_image_ids:
            log.info(
                f"{len(progress.skipped_image_ids)} training images skipped so far, unreadable or with invalid "
                "annotations (data.on_bad_sample=skip)."
            )


class EvalHook(HookBase):
    """COCO evaluation every ``eval_every`` epochs (not the last), every ``eval_every_iters`` steps, and at the end."""

    def __init__(self) -> None:
        self.last: EvalResult | None = None
        self.evaluated_at = self.recalled_at = -1  # recalled: from the log of the run this one resumes

    def evaluate(self, trainer: Trainer, epoch: int) -> None:
        """Evaluate now (if there is validation data and this iteration was not evaluated yet, by this run or by the
        run it resumes: `--resume` of a run that had ended adds no second record)."""
        iteration = trainer.progress.iteration
        if trainer.val_set is None or self.evaluated_at == iteration:
            return
        recorded = [r for r in log_records(trainer.out / METRICS_FILE) if r.get("type") == "eval"
                    and r.get("iteration") == iteration] if trainer.log is not None else []  # fmt: skip
        if any_process(bool(recorded) and (trainer.out / "metrics.json").is_file(), trainer.env.device):
            files = (trainer.out / "metrics.json", trainer.out / "detections.json") if recorded else (None, None)
            self.last = EvalResult(read_metrics(recorded[-1]) if recorded else {}, *files, len(trainer.val_set))
            self.evaluated_at = self.recalled_at = iteration
            return
        loaded = LoadedModel(trainer.eval_model, trainer.postprocessor, trainer.cfg, trainer.label_map)
        extra = {"epoch": epoch, "iteration": trainer.progress.iteration}
        self.last = evaluate_and_write(
            loaded, trainer.val_set, trainer.env, trainer.out, trainer.log, amp=trainer.amp, extra=extra
        )
        self.evaluated_at = trainer.progress.iteration
        trainer.model.train()  # back to training mode for the rest of the epoch

    def after_step(self, trainer: Trainer) -> None:
        every = trainer.cfg.train.eval_every_iters
        if not trainer.halt and every > 0 and trainer.progress.iteration % every == 0:
            self.evaluate(trainer, trainer.progress.last_epoch)

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        t, progress = trainer.cfg.train, trainer.progress
        last_epoch = progress.epoch >= t.epochs or trainer.stop_training()
        if stats.completed and not last_epoch and t.eval_every > 0 and progress.epoch % t.eval_every == 0:
            self.evaluate(trainer, stats.epoch)

    def after_train(self, trainer: Trainer) -> None:
        self.evaluate(trainer, trainer.progress.last_epoch)


class BestHook(HookBase):
    """After each evaluation of ``evaluations``: ``train.save_best`` writes the evaluated weights of the best one so
    far to ``checkpoint_best.pth`` (with ``best``: metric, value, iteration); ``train.early_stop`` ends the run after
    that many evaluations without a better value. A resumed run takes the best so far from ``metrics.jsonl``."""

    def __init__(self, evaluations: EvalHook) -> None:
        self.evaluations, self.seen = evaluations, None
        self.best: tuple[float, int] | None = None  # value, iteration
        self.since = 0  # evaluations since the best
        self.announced = False

    def _recall(self, trainer: Trainer, metric: str) -> None:
        """The best value and the evaluations after it, from the eval records of earlier iterations."""
        for record in log_records(trainer.out / METRICS_FILE):  # a line a killed run left half-written is passed over
            value, iteration = record.get(metric), record.get("iteration")
            if record.get("type") == "eval" and is_number(iteration) and iteration < trainer.progress.iteration:
                self._update(float(value) if is_number(value) else -1.0, int(iteration))

    def _update(self, value: float, iteration: int) -> bool:
        if not value >= 0:  # pycocotools' -1: undefined on this data (no objects of the size), so not ranked; NaN
            return False
        better = self.best is None or value > self.best[0]
        self.best, self.since = ((value, iteration), 0) if better else (self.best, self.since + 1)
        return better

    def _check(self, trainer: Trainer) -> None:
        last, t, iteration = self.evaluations.last, trainer.cfg.train, self.evaluations.evaluated_at
        if last is None or iteration in (self.seen, self.evaluations.recalled_at) or not (t.save_best or t.early_stop):
            return
        metric = t.save_best or "AP"
        if self.seen is None:
            self._recall(trainer, metric)
        self.seen = iteration
        value = float(last.metrics.get(metric, -1))
        if value < 0 and trainer.log is not None:
            trainer.log.info(f"Note: {metric} is undefined at iteration {iteration} (no objects of its size in "
                             "the validation data): this evaluation neither counts as best nor for train.early_stop")  # fmt: skip
        if self._update(value, iteration) and t.save_best:
            best = {"metric": metric, "value": value, "iteration": iteration}
            state, labels = trainer.eval_model.state_dict(), trainer.label_map.to_dict()
            path = trainer.out / BEST_CHECKPOINT
            on_main(
                trainer.env, lambda: save_checkpoint(path, trainer.cfg, state, labels, iteration=iteration, best=best)
            )
            if trainer.log is not None:
                trainer.log.info(f"best {metric} so far: {value:.1f} % at iteration {iteration}; wrote {path}")

    def stop_training(self, trainer: Trainer) -> bool:
        patience = trainer.cfg.train.early_stop
        stop = patience > 0 and self.since >= patience and self.best is not None
        if stop and not self.announced and trainer.log is not None:
            self.announced = True
            metric, (value, at) = trainer.cfg.train.save_best or "AP", self.best
            trainer.log.write({"type": "early_stop", "iteration": trainer.progress.iteration, "metric": metric,
                               "best": value, "best_iteration": at})  # fmt: skip
            trainer.log.info(f"Early stop (train.early_stop={patience}): {self.since} evaluations without a better "
                             f"{metric} than {value:.1f} % at iteration {at}.")  # fmt: skip
        return stop

    def halt_epoch(self, trainer: Trainer) -> bool:
        return self.stop_training(trainer)

    def after_step(self, trainer: Trainer) -> None:
        self._check(trainer)
        trainer.halt = trainer.halt or self.stop_training(trainer)  # right after the evaluation that decided it

    def after_epoch(self, trainer: Trainer, stats: EpochStats) -> None:
        self._check(trainer)

    def after_train(self, trainer: Trainer) -> None:
        self._check(trainer)


def default_hooks() -> list[HookBase]:
    """The hooks of ``detr-peg train``, in the order they run (see the module docstring)."""
    return [
        LrScheduleHook(),
        WeightAverageHook(),
        BudgetHook(),
        CheckpointHook(),
        EpochLogHook(),
        StopSignalHook(),
        evaluations := EvalHook(),
        BestHook(evaluations),
    ]
