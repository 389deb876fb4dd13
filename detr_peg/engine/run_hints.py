"""Notes printed after short trainings and empty predictions: why a barely trained detector finds little."""

from __future__ import annotations

from detr_peg.engine.evaluation.metric_units import format_percent

#: Below this AP (percent) a model has learned next to nothing.
NEAR_ZERO_AP = 1.0
#: Fewer training iterations than this: on real images boxes are expected to miss the objects.
FEW_ITERATIONS = 10_000

_LONGER = "train longer (train.max_iters, or train.epochs with train.max_iters=null) or start from trained weights"


def low_ap_note(ap: float | None, iterations: int, from_scratch: bool = True) -> str | None:
    """The note for an AP (percent) below :data:`NEAR_ZERO_AP` after ``iterations`` from scratch; None otherwise."""
    if ap is None or ap < 0 or ap >= NEAR_ZERO_AP or not from_scratch:
        return None
    return (
        f"Note: AP {format_percent(ap)} after {iterations} iterations is expected from so short a training: a "
        f"detector trained from scratch needs thousands of iterations before its boxes land on objects; {_LONGER} "
        "(train.init_from, or detr-peg convert of an official checkpoint)."
    )


def no_detections_note(threshold: float, iterations: int | None, option: str) -> str:
    """The note for a prediction that kept no detection at ``threshold`` (set by ``option``)."""
    trained = f"after {iterations} training iterations " if iterations is not None else ""
    return (
        f"Note: no detection scored at least {threshold:g}; a model {trained}that scores below that is expected when "
        f"it is barely trained: lower {option} (for example {option} 0.05) to see its best guesses, or {_LONGER}."
    )


def short_training_note(iterations: int | None) -> str | None:
    """The note for detections of a checkpoint trained for fewer than :data:`FEW_ITERATIONS`; None otherwise."""
    if iterations is None or iterations >= FEW_ITERATIONS:
        return None
    return (
        f"Note: the checkpoint was trained for {iterations} iterations only; on real images its boxes are expected to "
        f"miss the objects (detectors of this kind need tens of thousands); {_LONGER}."
    )
