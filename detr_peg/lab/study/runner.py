"""Running a study: record ``plan.json``, refuse a changed definition or cell config, run missing cells, write results.

A changed seed count adds or leaves out cells; a failed cell does not stop the others.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from detr_peg.engine.evaluation.scales import canvas_data, check_scales
from detr_peg.engine.metrics_log import format_duration
from detr_peg.errors import ConfigError, DataError, UserError
from detr_peg.lab.study.cell import (
    CellOutcome,
    CommandRunner,
    cell_config,
    cell_paths,
    eval_argv,
    first_difference,
    is_done,
    read_state,
    resolved_config,
    run_cell,
    stored_config,
    table_row,
    train_argv,
)
from detr_peg.lab.study.comparisons import ComparisonOptions
from detr_peg.lab.study.grid import Cell, EvalPlan, StudyDefinition, expand_cells, run_order
from detr_peg.lab.study.parallel import run_parallel
from detr_peg.lab.study.results import collect
from detr_peg.lab.study.seed_rule import SeedRule, next_seeds, stop_reason
from detr_peg.lab.study.stored_files import CELLS_CSV, PLAN_FILE, read_plan
from detr_peg.messages import listed
from detr_peg.outputs import write_json

#: Exit status of a study in which some cells failed (the others finished).
CELLS_FAILED = 3


class StudyInterrupted(UserError):
    """A cell was stopped by a signal; the study resumes with the same command."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def prepare(
    study_dir: str | Path, definition: StudyDefinition, *, write: bool = True, report: dict | None = None
) -> list[Cell]:
    """The study's cells, after checking the folder's earlier plan and cells; writes ``plan.json``.

    Raises ``ConfigError``: an invalid cell config, a definition changed other than in seeds, a changed cell.
    """
    study_dir = Path(study_dir)
    cells = expand_cells(definition)
    configs = {cell.name: resolved_config(cell) for cell in cells}  # every cell's config is valid before any runs
    check_distinct_runs(cells, configs)
    earlier = read_plan(study_dir)
    if earlier is not None:
        before = StudyDefinition.from_dict(earlier["definition"])
        # A copy published with its paths made relative (see the Studies page) names its configs from where it runs.
        before = replace(before, configs=tuple(str(Path(c).resolve()) for c in before.configs))
        if replace(before, seeds=definition.seeds) != definition:
            change = first_difference(replace(before, seeds=0).to_dict(), replace(definition, seeds=0).to_dict())
            raise ConfigError(
                f"{study_dir} holds a study with another definition ({change}); use another --output, "
                "or run it with its own options (see its plan.json)."
            )
    changed, published = [], []
    for cell in cells:
        state = read_state(cell_paths(study_dir, cell))
        recorded = state or table_row(study_dir, cell)  # a cell.json, or a published row: both hold the config
        if recorded and recorded.get("config_resolved"):
            change = first_difference(stored_config(recorded), configs[cell.name])
            if change:
                (changed if state is not None else published).append(f"{cell.name} ({change})")
    for found, advice in ((changed, "delete those cell folders"), (published, f"remove their rows from {CELLS_CSV}")):
        if found:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            raise ConfigError(
                f"The config of cell {found[0]}{more} changed since it was started; restore the base config, "
                f"or {advice} to run them again."
            )
    if write:
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json(study_dir / PLAN_FILE, {**plan_record(study_dir, definition, cells), **(report or {})})
    return cells


def check_distinct_runs(cells: Sequence[Cell], configs: dict[str, dict]) -> None:
    """Raise ``ConfigError`` naming two cells whose resolved configs are equal (one run under two names)."""
    first: dict[str, Cell] = {}
    for cell in cells:
        key = json.dumps(configs[cell.name], sort_keys=True, default=str)
        other = first.setdefault(key, cell)
        if other is cell:
            continue
        if other.config != cell.config:
            raise ConfigError(
                f"The cells {other.name} and {cell.name} would train the same config: {other.config} and "
                f"{cell.config} resolve alike{_with_values(other, cell)}; keep one of the two config files."
            )
        apart = [f"{k}={a} and {k}={b}" for (k, a), (_, b) in zip(other.values, cell.values) if a != b]
        raise ConfigError(
            f"The cells {other.name} and {cell.name} would train the same config ({'; '.join(apart)} read as one "
            "value); give each grid value once."
        )


def _with_values(a: Cell, b: Cell) -> str:
    """`` with model.x=1`` when the two cells share their grid values, for a message; empty when they have none."""
    return f" with {', '.join(f'{k}={v}' for k, v in a.values)}" if a.values and a.values == b.values else ""


#: The synthetic datasets of the shipped configs, and the command that writes each.
DATASETS = {
    "outputs/demo/data": "detr-peg demo --data-only",
    "outputs/proxy_data/data": "detr-peg demo --data-only --output outputs/proxy_data --num-train 2000 --num-val 1000",
}

#: The dataset fields of a config that must name existing files or folders before a study runs.
DATA_PATHS = {
    "train_images": Path.is_dir,
    "train_annotations": Path.is_file,
    "val_images": Path.is_dir,
    "val_annotations": Path.is_file,
}


def check_data_paths(cells: Sequence[Cell]) -> None:
    """Raise ``DataError`` for the first dataset file or folder a cell reads that is not there, before any cell runs."""
    seen: set[tuple[str, str]] = set()
    for cell in cells:
        data = cell_config(cell).data
        for field, exists in DATA_PATHS.items():
            value = getattr(data, field)
            if value is None or (field, value) in seen:
                continue
            seen.add((field, value))
            if not exists(Path(value)):
                kind = "folder" if exists is Path.is_dir else "file"
                hint = next(
                    (f" (the synthetic dataset: {command})" for root, command in DATASETS.items() if Path(root) in
                     Path(value).parents),
                    "",
                )  # fmt: skip
                raise DataError(
                    f"{cell.config}: data.{field} is {value}, which is not an existing {kind} "
                    f"(relative paths are read from {Path.cwd()}); create the dataset first{hint}."
                )


def check_test_scales(cells: Sequence[Cell], plan: EvalPlan) -> None:
    """Raise ``ConfigError`` for test scales ``detr-peg eval`` would refuse for a cell's data, before any training."""
    if not (plan.scales or plan.canvas_scales):
        return
    for config in dict.fromkeys(cell.config for cell in cells):
        cell = next(c for c in cells if c.config == config)
        data = cell_config(cell).data  # its own errors name their source
        try:
            check_scales(data, plan.scales, plan.canvas_scales)
        except ConfigError as exc:
            raise ConfigError(f"{config}: {exc}") from None


def plan_record(study_dir: Path, definition: StudyDefinition, cells: Sequence[Cell]) -> dict:
    """The content of ``plan.json``: the definition and each cell's commands."""
    out = []
    for cell in cells:
        paths = cell_paths(study_dir, cell)
        commands = [train_argv(cell, paths)]
        if eval_argv(paths, definition.eval) is not None:
            commands.append(eval_argv(paths, definition.eval))
        out.append(
            {
                "name": cell.name,
                "setting": cell.setting,
                "seed": cell.seed,
                "config": cell.config,
                "values": dict(cell.values),
                "commands": [["detr-peg", *argv] for argv in commands],
            }
        )
    return {"definition": definition.to_dict(), "cells": out}


def make_canvas_sets(cells: Sequence[Cell], scales: Sequence[float]) -> None:
    """Generate the larger-canvas validation sets of the cells' datasets once, before cells run concurrently."""
    seen = set()
    for cell in cells:
        data = cell_config(cell).data
        if data.val_annotations in seen:
            continue
        seen.add(data.val_annotations)
        for scale in scales:
            canvas_data(data, scale)


def run_here(
    study_dir: str | Path,
    definition: StudyDefinition,
    cells: Sequence[Cell],
    run_command: CommandRunner,
    *,
    jobs: int = 1,
) -> list[CellOutcome]:
    """Run the cells seed by seed, here or ``jobs`` at a time; ``StudyInterrupted`` when a signal stopped a cell."""
    study_dir = Path(study_dir)
    cells = run_order(cells)
    if jobs > 1:
        outcomes, signum = run_parallel(study_dir, cells, definition.eval, run_command, jobs=jobs, describe=describe)
        stopped = [o for o in outcomes if o.status == "interrupted"]
        if signum is not None or stopped:
            code = 128 + signum if signum is not None else stopped[0].exit_code
            names = listed(o.name for o in stopped)
            raise StudyInterrupted(
                f"the study was stopped ({len(stopped)} running cells stopped{': ' + names if names else ''}); "
                "run the same command again to resume.",
                code,
            )
        return outcomes
    todo = [cell for cell in cells if not is_done(study_dir, cell)]
    outcomes = [CellOutcome(cell.name, "skipped") for cell in cells if cell not in todo]
    bar = tqdm(
        total=len(cells),
        initial=len(outcomes),
        unit="cell",
        desc="study",
        dynamic_ncols=True,
        disable=not sys.stderr.isatty(),
    )
    try:
        for cell in todo:
            bar.set_postfix_str(cell.name, refresh=True)
            outcome = run_cell(cell, cell_paths(study_dir, cell), definition.eval, run_command)
            outcomes.append(outcome)
            bar.update(1)
            bar.write(describe(outcome, len(outcomes), len(cells)), file=sys.stdout)
            if outcome.status == "interrupted":
                raise StudyInterrupted(
                    f"cell {cell.name} was stopped ({outcome.error}); run the same command again to resume.",
                    outcome.exit_code,
                )
    finally:
        bar.close()
    return outcomes


#: Runs the cells of one round (here or as jobs) and returns their outcomes.
RoundRunner = Callable[[StudyDefinition, list[Cell]], Sequence[CellOutcome]]


def run_in_rounds(
    study_dir: str | Path,
    definition: StudyDefinition,
    rule: SeedRule,
    options: ComparisonOptions,
    run_round: RoundRunner,
    report: dict | None = None,
) -> tuple[StudyDefinition, list[Cell], str]:
    """``--seeds auto``: rounds of seeds until ``stop_reason`` stops them; the last definition, cells and reason."""
    study_dir = Path(study_dir)
    earlier = read_plan(study_dir)
    seeds = rule.start(int(earlier["definition"]["seeds"]) if earlier else 0)
    while True:
        definition = replace(definition, seeds=seeds)
        cells = prepare(study_dir, definition, report=report)
        print(f"study: round of {seeds} seeds per setting ({len(cells)} cells)", flush=True)
        outcomes = run_round(definition, cells)
        failed = sum(o.status == "failed" for o in outcomes)
        comparisons = collect(study_dir, definition, cells, options)["comparisons"]
        reason = stop_reason(comparisons, seeds, rule, failed)
        if reason is not None:
            print(f"study: seeds auto stopped at {seeds} seeds per setting: {reason}", flush=True)
            return definition, cells, reason
        seeds = next_seeds(comparisons, seeds, rule)


def describe(outcome: CellOutcome, index: int, total: int) -> str:
    """One line about a finished cell: ``study: [3/8] peg_seed1 done in 0:01:02``."""
    head = f"study: [{index}/{total}] {outcome.name} {outcome.status}"
    if outcome.status == "done":
        return f"{head} in {format_duration(outcome.seconds)}"
    return f"{head}: {outcome.error}" if outcome.error else head


def summary_line(study_dir: Path, cells: Sequence[Cell], started: float) -> tuple[str, int]:
    """The last line of a study and its exit status (0, or :data:`CELLS_FAILED`)."""
    failed = [c.name for c in cells if (read_state(cell_paths(study_dir, c)) or {}).get("status") == "failed"]
    done = sum(is_done(study_dir, c) for c in cells)
    line = (
        f"study: {done} of {len(cells)} cells done"
        + (f", {len(failed)} failed ({listed(failed)})" if failed else "")
        + f" in {format_duration(time.monotonic() - started)}; results in {study_dir / 'study.md'}"
    )
    return line, CELLS_FAILED if failed else 0
