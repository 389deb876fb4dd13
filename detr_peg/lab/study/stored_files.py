"""The files a study writes and reads back, with their declared shapes.

A damaged file raises one sentence naming it, the field and the value; a missing one reads as None.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detr_peg.bounded_read import parse_json, read_bounded_bytes
from detr_peg.config.ranges import is_number, is_whole
from detr_peg.engine.evaluation.metric_units import STAT_NAMES, percent_metrics
from detr_peg.errors import DamagedFileError
from detr_peg.lab.study.grid import MAX_CELLS
from detr_peg.messages import shortened
from detr_peg.outputs import OWNERSHIP_FILE, Output, atomic_write_text, inputs


class ShapeError(Exception):
    """A value without its declared shape, at ``where`` (``definition.seeds``)."""


def _fail(where: str, value: Any, problem: str) -> ShapeError:
    shown = {dict: "an object", list: "a list"}.get(type(value)) or shortened(json.dumps(value, allow_nan=True))
    return ShapeError(f"{where or 'the file'} is {shown}, {problem}")


def _at(where: str, key: str | int) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)


class Shape:
    """A declared shape; ``check(value, where)`` raises :class:`ShapeError` for a value without it."""

    check: Callable[[Any, str], None]


@dataclass(frozen=True)
class Number(Shape):
    above: float | None = None

    def check(self, value: Any, where: str) -> None:
        if not is_number(value):
            raise _fail(where, value, "not a finite number")
        if self.above is not None and value <= self.above:
            raise _fail(where, value, f"not above {self.above:g}")


@dataclass(frozen=True)
class Integer(Shape):
    minimum: int = -(2**63)
    maximum: int = 2**63 - 1

    def check(self, value: Any, where: str) -> None:
        if not is_whole(value):
            raise _fail(where, value, "not a whole number")
        if not self.minimum <= value <= self.maximum:
            raise _fail(where, value, f"not from {self.minimum} to {self.maximum:,}")


@dataclass(frozen=True)
class Text(Shape):
    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise _fail(where, value, f"not one of {', '.join(self.choices)}" if self.choices else "not a string")


@dataclass(frozen=True)
class Flag(Shape):
    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, bool):
            raise _fail(where, value, "not true or false")


@dataclass(frozen=True)
class Nullable(Shape):
    shape: Shape

    def check(self, value: Any, where: str) -> None:
        if value is not None:
            self.shape.check(value, where)


@dataclass(frozen=True)
class ListOf(Shape):
    shape: Shape
    min_length: int = 0

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) < self.min_length:
            raise _fail(where, value, f"not a list of at least {self.min_length} values")
        for index, item in enumerate(value):
            self.shape.check(item, _at(where, index))


@dataclass(frozen=True)
class MapOf(Shape):
    shape: Shape

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, value, "not an object")
        for key, item in value.items():
            self.shape.check(item, _at(where, key))


@dataclass(frozen=True)
class Fields(Shape):
    """An object with the ``required`` keys and perhaps the ``optional`` ones, each of its shape (others pass)."""

    required: Mapping[str, Shape] = field(default_factory=dict)
    optional: Mapping[str, Shape] = field(default_factory=dict)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, value, "not an object")
        for key, shape in [*self.required.items(), *self.optional.items()]:
            if key in value:
                shape.check(value[key], _at(where, key))
            elif key in self.required:
                raise ShapeError(f"{where or 'the file'} has no field {key!r}")


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
    },
)
CELL_STATE = Fields(
    required={"status": Text(STATUSES), "stages": MapOf(Text()), "config_resolved": Fields()},
    optional={"error": Nullable(Text())},
)
EVAL_METRICS = Fields({"bbox": METRICS}, optional={"unit": UNIT})
SCALES = Fields(
    {"results": ListOf(Fields({"scale": Number(above=0), "metrics": METRICS}))},
    optional={"unit": UNIT, "kind": Text(("resized", "canvas"))},
)
PADDING = Fields({"modes": MapOf(Fields({"metrics": METRICS}))}, optional={"unit": UNIT})

#: A run's ``confusion_matrix.json`` (``evaluation.per_class.confusion_matrix``).
CONFUSION = Fields({"iou": Number(), "score_threshold": Number(), "names": ListOf(Text(), 2),
                    "counts": ListOf(ListOf(Integer(0)))})  # fmt: skip
#: What a redraw reads back of the report it replaces (``study.json``): its cells' names and statuses.
REPORT = Fields({"cells": ListOf(Fields({"name": Text(), "status": Text()}))})

_RERUN_CELL = "delete the cell's folder to run the cell again"


def read_plan(study_dir: str | Path) -> dict[str, Any] | None:
    """``plan.json`` of a study folder, its shape checked, or None when there is none."""
    advice = "it is written by detr-peg study: restore it, or run the study in a new folder."
    return _read(Path(study_dir) / PLAN_FILE, PLAN, "Study plan", advice)


def read_cell_state(path: Path) -> dict[str, Any] | None:
    """A cell's ``cell.json`` (None before the cell's first start)."""
    return _read(path, CELL_STATE, "Cell state", f"it is written by detr-peg study: restore it, or {_RERUN_CELL}.")


def read_eval_file(path: Path, shape: Shape) -> dict[str, Any] | None:
    """One of a cell's evaluation files (``metrics.json``, ``scales_*.json``, ``padding.json``), or None."""
    writer = "train" if path.parent.name == "run" else "eval"
    advice = f"it is written by detr-peg {writer}: restore it, or {_RERUN_CELL}."
    data = _read(path, shape, "Evaluation file", advice)
    tables = [] if data is None else [data["bbox"]] if "bbox" in data else [
        row["metrics"] for row in [*data.get("results", []), *data.get("modes", {}).values()]]  # fmt: skip
    try:
        [percent_metrics(table, data.get("unit")) for table in tables]
    except ValueError as exc:  # a unit it does not know, or percent without its unit
        raise DamagedFileError(f"Evaluation file {path}: {exc}; {advice}") from None
    return data


def read_confusion(path: Path) -> dict[str, Any] | None:
    """A run's ``confusion_matrix.json``, square and of its names' size, or None when there is none."""
    advice = "it is written by detr-peg eval and train: restore it, or evaluate again."
    data = _read(path, CONFUSION, "Confusion matrix", advice)
    if data is not None and {len(row) for row in [data["counts"], *data["counts"]]} != {len(data["names"])}:
        raise DamagedFileError(f"Confusion matrix {path}: counts is not {len(data['names'])} x {len(data['names'])}, "
                               f"one row and column per name; {advice}")  # fmt: skip
    return data


def read_report_cells(path: Path) -> list[dict[str, Any]] | None:
    """The cells of a study's ``study.json`` (name and status), or None when there is none."""
    data = _read(path, REPORT, "Study report", "it is written by detr-peg study and plot: delete it to redraw.")
    return None if data is None else data["cells"]


def _read(path: Path, shape: Shape, what: str, advice: str) -> dict[str, Any] | None:
    """The content of ``path`` (None when absent), bounded and checked against ``shape``; raises DamagedFileError."""
    if not os.path.lexists(path):
        return None
    raw = read_bounded_bytes(path, what, "record", DamagedFileError)
    data = parse_json(raw, path, what, "record", DamagedFileError, advice)
    try:
        shape.check(data, "")
    except ShapeError as err:
        raise DamagedFileError(f"{what} {path}: {err}; {advice}") from None
    return data


#: One row per cell: what every table, comparison and figure of the report is drawn from.
CELLS_CSV = "cells.csv"
_HEADER_COLUMNS = ("name", "setting", "seed", "config", "values", "status", "error", "published", "config_resolved",
                   "curve")  # fmt: skip
_SCALE_KINDS = ("resized", "canvas")
#: How many words a column's name has, by its first word (a COCO number's column is one word).
_COLUMN_WORDS = {"resized": (3,), "canvas": (3,), "padding": (2, 3), "cost": (2,)}


def cell_row(record: dict[str, Any]) -> dict[str, Any]:
    """A cell's record as one flat ``cells.csv`` row (JSON for ``config_resolved`` and ``values``; all digits kept)."""
    row: dict[str, Any] = {key: record.get(key) for key in ("name", "setting", "seed", "config")}
    row["values"] = json.dumps(record.get("values") or {})
    row.update(status=record.get("status"), error=record.get("error"))
    row["published"] = "yes" if record.get("published") else ""
    config = record.get("config_resolved")
    row["config_resolved"] = json.dumps(config, sort_keys=True, separators=(",", ":")) if config else None
    row.update(record.get("metrics") or {})
    for kind in _SCALE_KINDS:
        for entry in record.get(kind) or []:
            row.update(_flat(f"{kind} x{entry['scale']!r}", {k: v for k, v in entry.items() if k != "scale"}))
    for key, value in (record.get("padding") or {}).items():  # in the file's order, its modes in place
        for mode, result in value.items() if key == "modes" else []:
            row.update(_flat(f"padding {mode}", result))
        if key != "modes":
            row[f"padding {key}"] = "null" if value is None else value
    row.update({f"cost {k}": v for k, v in (record.get("cost") or {}).items()})
    row["curve"] = ";".join(f"{it}:{value!r}" for it, value in record.get("curve") or [])
    return {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()}


def _flat(prefix: str, entry: dict[str, Any]) -> dict[str, Any]:
    """``entry``'s fields as ``<prefix> <field>`` columns, its ``metrics`` spread in place (the order kept)."""
    flat = {}
    for key, value in entry.items():
        for name, number in value.items() if key == "metrics" else [(key, value)]:
            flat[f"{prefix} {name}"] = number
    return flat


def write_cells_csv(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write ``cells.csv`` (:func:`cell_row` of every record; columns in order of first appearance)."""
    rows = [cell_row(r) for r in records]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, out.getvalue())
    return path


def _number(text: str) -> Any:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def read_cells_csv(path: Path) -> dict[str, dict[str, Any]]:
    """The records of ``cells.csv`` by cell name (inverse of :func:`cell_row`); ``DamagedFileError`` if not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no table; a study folder that is not one is named elsewhere
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedFileError(f"Cell table {path} cannot be read ({exc}); restore it from the repository.") from None
    records = {}
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            records[row["name"]] = _record(row)
        except (KeyError, ValueError, TypeError) as exc:
            raise DamagedFileError(
                f"Cell table {path}, line {number}: not a row of detr-peg study ({exc!r}); restore it from the "
                "repository."
            ) from None
    return records


def _unflat(entry: dict[str, Any], name: str, value: Any) -> None:
    if name in STAT_NAMES:
        entry.setdefault("metrics", {})[name] = value
    else:
        entry[name] = value


def _record(row: dict[str, str]) -> dict[str, Any]:
    values = json.loads(row["values"])
    config = json.loads(row["config_resolved"]) if row.get("config_resolved") else None
    if not isinstance(values, dict) or not isinstance(config, (dict, type(None))):
        raise ValueError("values and config_resolved must be JSON objects")
    metrics: dict[str, Any] = {}
    scales: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in _SCALE_KINDS}
    padding: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    for column, text in row.items():
        if column in _HEADER_COLUMNS or text in ("", None):
            continue
        value, words = (None if text == "null" else _number(text)), column.split(" ")
        if len(words) not in _COLUMN_WORDS.get(words[0], (1,)) or (
            words[0] in _SCALE_KINDS and not words[1].startswith("x")
        ):
            raise ValueError(f"column {column!r}")
        if words[0] in _SCALE_KINDS:
            entry = scales[words[0]].setdefault(words[1], {"scale": _number(words[1][1:])})
            _unflat(entry, words[2], value)
        elif words[0] == "padding" and len(words) == 3:
            _unflat(padding.setdefault("modes", {}).setdefault(words[1], {}), words[2], value)
        elif words[0] == "padding":
            padding[words[1]] = value
        elif words[0] == "cost":
            cost[words[1]] = value
        else:
            metrics[column] = value
    pairs = [p.split(":") for p in row["curve"].split(";")] if row.get("curve") else []
    return {  # the key order of collect_cell's records, so study.json is the same either way
        "name": row["name"], "setting": row.get("setting") or None, "seed": int(row["seed"]),
        "config": row.get("config") or None, "values": values, "status": row.get("status") or None,
        "error": row.get("error") or None, "config_resolved": config, "published": row.get("published") == "yes",
        "metrics": metrics or None,
        "curve": [(int(it), float(value)) for it, value in pairs],
        "cost": cost or None,
        **{kind: sorted(entries.values(), key=lambda e: float(e["scale"])) for kind, entries in scales.items()},
        "padding": padding or None,
    }  # fmt: skip


#: What a study writes into its folder, and the figures (each in every format) ``plot`` draws.
STUDY_NAMES = (PLAN_FILE, "cells", "jobs", "plots", "study.json", "study.csv", "cells.csv", "study.md")
STUDY_FIGURES = ("comparisons", "ap_vs_scale", "learning_curves", "main_metrics")
RUN_FIGURES = ("learning_curve", "confusion_matrix")
FORMATS = ("pdf", "png")  # vector for print, PNG for screens and the docs


def figure_files(names: Sequence[str]) -> tuple[str, ...]:
    """The file names of figures ``names`` in every format."""
    return tuple(f"{name}.{fmt}" for name in names for fmt in FORMATS)


def _study_outputs(folder: str | os.PathLike, option: str, names: Sequence[str], adopt: bool) -> list[Output]:
    figures = figure_files(STUDY_FIGURES)
    return [Output(Path(folder) / "plots", option, figures, "study", adopt),
            Output(folder, option, names, "study", adopt)]  # fmt: skip


def study_io(study_dir: str | os.PathLike, configs: Sequence[str | os.PathLike], study_file: object) -> tuple:
    """A study: its study file and configs in; its folder out (adopted when it holds ``plan.json``)."""
    reads = inputs((study_file, "--study"), *((c, "--config") for c in configs))
    return reads, _study_outputs(study_dir, "--output", STUDY_NAMES, (Path(study_dir) / PLAN_FILE).is_file())


def publish_io(study_dir: str | os.PathLike, dest: str | os.PathLike) -> tuple:
    """``plot STUDY --publish DEST``: the study in; the copy out (adopted when it holds ``plan.json``)."""
    names = (PLAN_FILE, "cells", *STUDY_NAMES[4:], "plots")
    outputs = _study_outputs(dest, "--publish", names, (Path(dest) / PLAN_FILE).is_file())
    return inputs((study_dir, "RUN_OR_STUDY")), outputs[::-1]  # the copy's folder first: refusals name it


def plot_io(folder: str | os.PathLike, study: bool) -> tuple:
    """The tables and figures of a study folder (adopted when never claimed: a published copy), or a run's learning
    curve (a figure without a record is the user's: a run copied without its hidden files keeps it)."""
    root, adopt = Path(folder), not os.path.lexists(Path(folder) / OWNERSHIP_FILE)
    if study:
        return [], _study_outputs(root, "RUN_OR_STUDY", (*STUDY_NAMES[4:], "plots"), adopt)
    return [], [Output(root / "plots", "RUN_OR_STUDY", figure_files(RUN_FIGURES), "train"),
                Output(root, "RUN_OR_STUDY", ("plots",), "train", adopt)]  # fmt: skip
