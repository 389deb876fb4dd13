"""A bench case of a tiny model (``tests.engine.tiny_run.TINY_MODEL``), for the bench's tests."""

from __future__ import annotations

from typing import Any

from detr_peg.lab.benchmark import worker
from tests.conftest import REPO_ROOT
from tests.engine.tiny_run import TINY_MODEL


def tiny_case(**fields: Any) -> worker.Case:
    """An inference case of the tiny DETR at 64 x 64, one thread, one run and no warm-up; ``fields`` change it."""
    defaults: dict[str, Any] = dict(
        label="tiny",
        impl="detr_peg",
        mode="infer",
        config=str(REPO_ROOT / "configs" / "detr_r50_sine.yaml"),
        overrides=list(TINY_MODEL),
        height=64,
        width=64,
        threads=1,
        warmup=0,
        runs=1,
    )
    return worker.Case(**{**defaults, **fields})
