"""One cell of a study: ``STUDY/cells/<name>/`` with ``run/``, ``eval/``, ``cell.json`` (its state) and ``cell.log``.

Its commands are the printed ``detr-peg`` commands; training always runs with ``--resume``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detr_peg.config.loader import config_from_dict, config_to_dict, load_config
from detr_peg.config.schema import Config
from detr_peg.errors import UserError
from detr_peg.lab.study.grid import Cell, EvalPlan
from detr_peg.lab.study.records import record
from detr_peg.lab.study.stored_files import CELLS_CSV, read_cell_state, read_cells_csv
from detr_peg.outputs import holder_alive, write_json

CELLS_DIR = "cells"
STATE_FILE = "cell.json"
LOG_FILE = "cell.log"
#: Config fields that name where a cell lives rather than what it computes (not compared on resume).
PLACE_KEYS = ("train.output_dir", "train.resume")
#: Exit statuses of a command stopped by SIGINT / SIGTERM.
STOP_CODES = (130, 143)

#: Runs ``detr-peg ARGV`` with its output appended to a log file; returns the exit status and, when it is
#: not 0, the command's one-line error.
CommandRunner = Callable[[list[str], Path], tuple[int, str | None]]


@dataclass(frozen=True)
class CellPaths:
    """The files of one cell."""

    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE


@dataclass
class CellOutcome:
    """What happened to a cell now: ``status`` ``done``, ``skipped``, ``failed`` or ``interrupted`` (resumable)."""

    name: str
    status: str
    error: str | None = None
    exit_code: int = 0
    seconds: float = 0.0


def cell_paths(study_dir: str | Path, cell: Cell) -> CellPaths:
    return CellPaths(Path(study_dir) / CELLS_DIR / cell.name)


def train_argv(cell: Cell, paths: CellPaths) -> list[str]:
    """``detr-peg train`` arguments of the cell (always ``--resume``: a missing checkpoint starts afresh)."""
    return ["train", "--config", cell.config, "--output", str(paths.run), "--resume", *cell.overrides]


def eval_argv(paths: CellPaths, plan: EvalPlan) -> list[str] | None:
    """``detr-peg eval`` arguments of the cell, or None when the training's last evaluation is enough."""
    if not plan.needed:
        return None
    argv = ["eval", "--checkpoint", str(paths.run / "checkpoint.pth"), "--output", str(paths.eval)]
    if plan.scales:
        argv += ["--scales", ",".join(f"{s:g}" for s in plan.scales)]
    if plan.canvas_scales:
        argv += ["--canvas-scales", ",".join(f"{s:g}" for s in plan.canvas_scales)]
    if plan.padding:
        argv.append("--padding")
    return argv


def cell_config(cell: Cell) -> Config:
    """The cell's config: its base config with its overrides; ``ConfigError`` names where a bad value was given."""
    return load_config(cell.config, cell.overrides, sources=dict(cell.sources))


def resolved_config(cell: Cell) -> dict[str, Any]:
    """The cell's resolved config as nested dicts, without location fields; ``ConfigError`` if invalid."""
    return _without_place(config_to_dict(cell_config(cell)))


def stored_config(state: dict[str, Any]) -> dict[str, Any]:
    """The resolved config a ``cell.json`` recorded, read by this schema (new fields take their defaults)."""
    recorded = state["config_resolved"]
    try:
        return _without_place(config_to_dict(config_from_dict(recorded, "cell.json")))
    except UserError:
        return recorded


def _without_place(data: dict[str, Any]) -> dict[str, Any]:
    for key in PLACE_KEYS:
        section, name = key.split(".")
        data.get(section, {}).pop(name, None)
    return data


def first_difference(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> str | None:
    """``"key: old -> new"`` for the first dotted key whose value differs, or None when equal."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = first_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: {a!r} -> {b!r}"
    return None


def read_state(paths: CellPaths) -> dict[str, Any] | None:
    """The cell's ``cell.json``, shape checked, or None before its first start; ``DamagedFileError`` if damaged."""
    return read_cell_state(paths.state)


def table_row(study_dir: str | Path, cell: Cell) -> dict[str, Any] | None:
    """The cell's published row of the study's ``cells.csv`` when the cell has no folder, else None."""
    if cell_paths(study_dir, cell).root.exists():
        return None
    table = Path(study_dir) / CELLS_CSV
    try:
        stamp = table.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    row = _published_rows(table, stamp.st_mtime_ns, stamp.st_size).get(cell.name)
    return None if row is None else dict(row)


@functools.lru_cache(maxsize=4)
def _published_rows(table: Path, mtime_ns: int, size: int) -> dict[str, dict[str, Any]]:
    """The published rows of ``table``, read once per version of the file."""
    return {name: row for name, row in read_cells_csv(table).items() if row["published"]}


def is_done(study_dir: str | Path, cell: Cell) -> bool:
    """Whether the cell finished: its ``cell.json`` says so, or, without a folder, its row of ``cells.csv``."""
    state = read_state(cell_paths(study_dir, cell))
    if state is not None:
        return state.get("status") == "done"
    row = table_row(study_dir, cell)
    return row is not None and row["status"] == "done"


def reported_status(state: dict[str, Any], paths: CellPaths, study_dir: Path) -> str:
    """The recorded status (``not started`` before any), or ``stopped``: ``running`` but held by no live process."""
    status = state.get("status", "not started")
    if status != "running":
        return status
    held = holder_alive(study_dir, "study") or holder_alive(paths.run) or holder_alive(paths.eval)
    return "running" if held else "stopped"


def write_state(paths: CellPaths, state: dict[str, Any]) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json(paths.state, state)


def new_state(cell: Cell, config: dict[str, Any]) -> dict[str, Any]:
    """A new ``cell.json``: the cell (without ``sources``) and its resolved config."""
    return {**record(cell), "config_resolved": config, "stages": {}, "status": "new", "error": None}


def run_cell(
    cell: Cell, paths: CellPaths, plan: EvalPlan, run_command: CommandRunner, *, is_main: bool = True
) -> CellOutcome:
    """Train and evaluate one cell, skipping what is done; only ``is_main`` writes ``cell.json``; re-raises Ctrl-C."""
    start = time.monotonic()
    state = read_state(paths) or new_state(cell, resolved_config(cell))
    if state.get("status") == "done":
        return CellOutcome(cell.name, "skipped")

    def save(**changes: Any) -> None:
        state.update(changes)
        if is_main:
            write_state(paths, state)

    save(status="running", error=None)
    try:
        for stage, argv in (("train", train_argv(cell, paths)), ("eval", eval_argv(paths, plan))):
            if argv is None or state["stages"].get(stage) == "done":
                continue
            code, error = run_command(argv, paths.log)
            if code != 0:
                status = "interrupted" if code in STOP_CODES else "failed"
                save(status=status, error=error)
                return CellOutcome(cell.name, status, error, code, time.monotonic() - start)
            state["stages"][stage] = "done"
            save()
    except KeyboardInterrupt:
        # A stop signal no command took over (between the commands, or before one installed its handlers):
        # the cell is stopped, not "running", whatever stops the process next.
        save(status="interrupted", error="stopped by a signal")
        raise
    save(status="done")
    return CellOutcome(cell.name, "done", seconds=time.monotonic() - start)
