"""Settings changed on resume, decided by one table, :data:`RULES` (Rule 4 of docs/guarantees.md)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from detr_peg.config.schema import Config
from detr_peg.errors import ConfigError


@dataclass(frozen=True)
class RunShape:
    """What a run looks like, for comparing with a checkpoint (``train_images`` None when unknown)."""

    config: Config
    world_size: int
    train_images: int | None


#: (setting, where a run holds it, policy, why it matters). "convert": the position is converted through the images
#: done; "mid-epoch": refused inside an epoch, applied from the next one at an epoch's end; "always": refused, as the
#: restored optimizer and schedule keep their own value. Settings without a row (train.epochs, max_iters) may change.
RULES: tuple[tuple[str, str, str, str], ...] = (
    ("train.batch_size", "config.train.batch_size", "convert", "the position is counted in batches of this size"),
    ("the number of processes", "world_size", "mid-epoch", "each process takes its own share of the epoch's order"),
    ("train.seed", "config.train.seed", "mid-epoch", "the seed draws the epoch's order"),
    ("the number of training images", "train_images", "mid-epoch", "another dataset has another order"),
    *(
        (f"train.{k}", f"config.train.{k}", "always", "")
        for k in ("lr", "lr_backbone", "weight_decay", "lr_drop", "lr_gamma", "warmup_iters")
    ),
)


def resume_position(
    checkpoint: str, stored: RunShape, current: RunShape, epoch: int, batches_done: int
) -> tuple[int, list[str]]:
    """The batches of epoch ``epoch`` done, in this run's units, and notes for the log (None values are not compared);
    ConfigError for a change that would skip or repeat images, or that the restored optimizer would override."""
    notes: list[str] = []
    for setting, field, policy, why in RULES:
        old, new = attrgetter(field)(stored), attrgetter(field)(current)
        if old is None or new is None or old == new:
            continue
        if policy == "always":
            raise ConfigError(
                f"{setting} is {new} but {checkpoint} was trained with {old}, which the restored optimizer keeps: "
                f"resume with {setting}={old}, or start a new run from its weights with train.init_from={checkpoint}."
            )
        if batches_done == 0:
            notes.append(f"{setting} is {new} (the checkpoint's run had {old}); it applies from epoch {epoch}")
            continue
        where = (
            f"{checkpoint} stopped in the middle of epoch {epoch} after {batches_done} batches of "
            f"{stored.config.train.batch_size} images per process"
        )
        if policy == "mid-epoch":
            raise ConfigError(
                f"{where}; {setting} is {new} but was {old}, and {why}, so resuming now would skip or repeat "
                f"images: resume with the checkpoint's value ({old}), or start a new run."
            )
        images = batches_done * old  # policy "convert": train.batch_size
        if images % new:
            raise ConfigError(
                f"{where}; train.batch_size {new} does not divide the {images} images done, so resuming would skip "
                f"or repeat images: resume with train.batch_size={old} (or a size dividing {images})."
            )
        notes.append(f"{where}; with train.batch_size {new} the epoch continues after batch {images // new}")
        batches_done = images // new
    return batches_done, notes


def stored_shape(config: Config, extra: dict[str, Any]) -> RunShape:
    """The :class:`RunShape` of the run that wrote a checkpoint (its config and training state)."""
    counts = (extra.get("world_size"), extra.get("train_images"))
    return RunShape(config, *(int(n) if isinstance(n, int) else None for n in counts))
