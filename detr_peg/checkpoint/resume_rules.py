"""Settings changed between a checkpoint and the run that resumes it: one table, :data:`RULES`, decides (Rule 4 of
docs/guarantees.md). A new setting that affects the epoch's order gets a row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from detr_peg.config.schema import Config
from detr_peg.errors import ConfigError

Policy = Literal["convert", "refuse_mid_epoch", "refuse", "continue"]


@dataclass(frozen=True)
class RunShape:
    """What a run looks like, for comparing with a checkpoint (``train_images`` None when unknown)."""

    config: Config
    world_size: int
    train_images: int | None


@dataclass(frozen=True)
class ResumeRule:
    """What to do when one setting differs on resume (``policy``: see Rule 4); ``why`` is quoted in messages."""

    setting: str
    value: Callable[[RunShape], Any]
    policy: Policy
    why: str


RULES: tuple[ResumeRule, ...] = (
    ResumeRule(
        "train.batch_size",
        lambda s: s.config.train.batch_size,
        "convert",
        "the position is counted in batches of this size",
    ),
    ResumeRule(
        "the number of processes",
        lambda s: s.world_size,
        "refuse_mid_epoch",
        "each process takes its own share of the epoch's order",
    ),
    ResumeRule("train.seed", lambda s: s.config.train.seed, "refuse_mid_epoch", "the seed draws the epoch's order"),
    ResumeRule(
        "the number of training images",
        lambda s: s.train_images,
        "refuse_mid_epoch",
        "another dataset has another order",
    ),
    *(
        ResumeRule(
            f"train.{key}",
            lambda s, k=key: getattr(s.config.train, k),
            "refuse",
            "the optimizer and schedule states restored from the checkpoint carry their own value",
        )
        for key in ("lr", "lr_backbone", "weight_decay", "lr_drop", "lr_gamma")
    ),
    ResumeRule("train.epochs", lambda s: s.config.train.epochs, "continue", "it does not touch the position"),
    ResumeRule("train.max_iters", lambda s: s.config.train.max_iters, "continue", "it does not touch the position"),
)


def resume_position(
    checkpoint: str, stored: RunShape, current: RunShape, epoch: int, batches_done: int
) -> tuple[int, list[str]]:
    """The batches of epoch ``epoch`` done, in this run's units, and notes for the log (None values are not compared).

    Raises ConfigError for a change that would skip or repeat images, or that the restored optimizer would override.
    """
    notes: list[str] = []
    for rule in RULES:
        old, new = rule.value(stored), rule.value(current)
        if old is None or new is None or old == new or rule.policy == "continue":
            continue
        if rule.policy == "refuse":
            raise ConfigError(
                f"{rule.setting} is {new} but {checkpoint} was trained with {old}, and {rule.why}, so the new value "
                f"would be ignored: resume with {rule.setting}={old}, or start a new run from the weights with "
                f"train.init_from={checkpoint}."
            )
        if batches_done == 0:
            notes.append(f"{rule.setting} is {new} (the checkpoint's run had {old}); it applies from epoch {epoch}")
            continue
        where = (
            f"{checkpoint} stopped in the middle of epoch {epoch} after {batches_done} batches of "
            f"{stored.config.train.batch_size} images per process"
        )
        if rule.policy == "convert":
            images = batches_done * old
            if images % new == 0:
                notes.append(f"{where}; with train.batch_size {new} the epoch continues after batch {images // new}")
                batches_done = images // new
                continue
            raise ConfigError(
                f"{where}; train.batch_size {new} does not divide the {images} images done, so resuming would skip "
                f"or repeat images: resume with train.batch_size={old} (or a size dividing {images})."
            )
        raise ConfigError(
            f"{where}; {rule.setting} is {new} but was {old}, and {rule.why}, so resuming now would skip or repeat "
            f"images: resume with the checkpoint's value ({old}), or start a new run."
        )
    return batches_done, notes


def stored_shape(config: Config, extra: dict[str, Any]) -> RunShape:
    """The :class:`RunShape` of the run that wrote a checkpoint (its config and training state)."""
    world = extra.get("world_size")
    images = extra.get("train_images")
    return RunShape(
        config, int(world) if isinstance(world, int) else None, int(images) if isinstance(images, int) else None
    )
