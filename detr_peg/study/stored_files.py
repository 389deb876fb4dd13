"""The files a study writes and reads back, with their declared shapes (see :mod:`detr_peg.fileio.json_shape`).

A study reads its own ``plan.json``, each cell's ``cell.json`` and the
evaluation files of its cells (``metrics.json``, ``scales_resized.json``,
``scales_canvas.json``, ``padding.json``) whenever it resumes or ``detr-peg
plot`` redraws its report. A file that was edited, cut short or replaced is
one sentence naming it, the field and the value, and what to do (exit status
2); a file that is not there is None (a cell not started, an evaluation not
asked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detr_peg.errors import DamagedFileError
from detr_peg.fileio.json_shape import (
    Anything,
    Fields,
    Flag,
    Integer,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Shape,
    Text,
    read_json_file,
)
from detr_peg.study.grid import MAX_CELLS

#: A study folder's plan: its definition, cells and report options (written by ``detr-peg study``).
PLAN_FILE = "plan.json"

#: COCO metrics in a file: name -> number (COCO's -1 for "no such objects" included).
METRICS = MapOf(Number())
#: ``percent`` in current files; older files (fractions) have no unit.
UNIT = Text(("percent",))
#: The statuses a cell records (a report adds ``not started`` and ``stopped``).
STATUSES = ("new", "running", "done", "failed", "interrupted")

PLAN = Fields(
    required={
        "definition": Fields(
            required={"configs": ListOf(Text(), min_length=1)},
            optional={
                "axes": ListOf(Fields({"key": Text(), "values": ListOf(Text(), min_length=1)})),
                "seeds": Integer(1, MAX_CELLS),
                "overrides": ListOf(Text()),
                "eval": Fields(
                    optional={
                        "scales": ListOf(Number(above=0)),
                        "canvas_scales": ListOf(Number(above=0)),
                        "padding": Flag(),
                    }
                ),
            },
        )
    },
    optional={
        "comparison": Nullable(Fields(optional={"baseline": Nullable(Text()), "equal_within": Number(above=0)})),
        "seeds_auto": Nullable(
            Fields(
                {"target_ci": Number(above=0), "max_seeds": Integer(2, MAX_CELLS)},
                optional={"first_round": Integer(1, MAX_CELLS)},
            )
        ),
        "cells": Anything(),
    },
)
CELL_STATE = Fields(
    required={"status": Text(STATUSES), "stages": MapOf(Text()), "config_resolved": MapOf(Anything())},
    optional={"error": Nullable(Text())},
)
EVAL_METRICS = Fields({"bbox": METRICS}, optional={"unit": UNIT})
SCALES = Fields(
    {"results": ListOf(Fields({"scale": Number(above=0), "metrics": METRICS}))},
    optional={"unit": UNIT, "kind": Text(("resized", "canvas"))},
)
PADDING = Fields({"modes": MapOf(Fields({"metrics": METRICS}))}, optional={"unit": UNIT})

#: What a redraw reads back of the report it replaces (``study.json``): its cells' names and statuses.
REPORT = Fields({"cells": ListOf(Fields({"name": Text(), "status": Text()}))})

_RERUN_CELL = "delete the cell's folder to run the cell again"


def read_plan_file(path: Path) -> dict[str, Any] | None:
    """A study's ``plan.json`` (None when there is none)."""
    advice = "it is written by detr-peg study: restore it, or run the study in a new folder."
    return _read(path, PLAN, "Study plan", advice)


def read_plan(study_dir: str | Path) -> dict[str, Any] | None:
    """``plan.json`` of a study folder (:data:`PLAN_FILE`), its shape checked, or None when there is none."""
    return read_plan_file(Path(study_dir) / PLAN_FILE)


def read_cell_state(path: Path) -> dict[str, Any] | None:
    """A cell's ``cell.json`` (None before the cell's first start)."""
    return _read(path, CELL_STATE, "Cell state", f"it is written by detr-peg study: restore it, or {_RERUN_CELL}.")


def read_eval_file(path: Path, shape: Shape) -> dict[str, Any] | None:
    """One of a cell's evaluation files (``metrics.json``, ``scales_*.json``, ``padding.json``), or None."""
    writer = "train" if path.parent.name == "run" else "eval"
    advice = f"it is written by detr-peg {writer}: restore it, or {_RERUN_CELL}."
    return _read(path, shape, "Evaluation file", advice)


def read_report_cells(path: Path) -> list[dict[str, Any]] | None:
    """The cells of a study's ``study.json`` (name and status), or None when there is none."""
    data = _read(path, REPORT, "Study report", "it is written by detr-peg study and plot: delete it to redraw.")
    return None if data is None else data["cells"]


def _read(path: Path, shape: Shape, what: str, advice: str) -> dict[str, Any] | None:
    return read_json_file(path, shape, what, advice, DamagedFileError)
