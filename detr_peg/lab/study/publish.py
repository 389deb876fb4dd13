"""A study's copy for ``detr-peg plot STUDY --publish DEST``: ``plan.json`` and ``cells.csv``, to redraw and resume.

Paths under the current folder are made relative; nothing is written when a check fails.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detr_peg.errors import ConfigError, OutputError
from detr_peg.lab.study.cell import first_difference
from detr_peg.lab.study.grid import StudyDefinition, expand_cells
from detr_peg.lab.study.results import cell_records
from detr_peg.lab.study.stored_files import CELLS_CSV, PLAN_FILE, read_cells_csv, read_plan, write_cells_csv
from detr_peg.outputs import atomic_write_text, make_folder


@dataclass(frozen=True)
class CopyPlan:
    """What :func:`write_copy` will write, checked: plan text, records, and cells copied, new, left out, kept."""

    plan_text: str
    records: list[dict[str, Any]]
    copied: list[str]
    new: list[str]
    left_out: list[str]
    kept: list[str] = field(default_factory=list)


def relative_text(text: str, relative_to: str | Path) -> str:
    """``text`` with absolute paths under ``relative_to`` (as given or resolved) made relative, at path starts only."""
    for folder in {os.path.abspath(relative_to), str(Path(relative_to).resolve())}:
        prefix = folder.rstrip(os.sep) + os.sep
        if len(prefix) > 1:
            text = re.sub(r"(?<![\w./~-])" + re.escape(prefix), "", text)
    return text


def plan_copy(source: str | Path, dest: str | Path, relative_to: str | Path = ".") -> CopyPlan:
    """Check everything a copy of ``source`` into ``dest`` needs, writing nothing.

    Raises ``ConfigError`` (no ``plan.json``; ``dest`` holds another study) or ``DamagedFileError``.
    """
    source, dest = Path(source), Path(dest)
    plan = read_plan(source)
    if plan is None:
        raise ConfigError(f"{source} is not a study folder (no {PLAN_FILE}); give the folder detr-peg study wrote.")
    try:
        plan_text = relative_text((source / PLAN_FILE).read_text(encoding="utf-8"), relative_to)
    except OSError as exc:
        raise OutputError(f"Could not read {source / PLAN_FILE}: {exc.strerror or exc}.") from None
    _check_same_study(json.loads(plan_text)["definition"], dest, relative_to)
    definition = StudyDefinition.from_dict(plan["definition"])
    earlier = read_cells_csv(dest / CELLS_CSV)
    records, copied, new, left_out, kept = [], [], [], [], []
    for record in cell_records(source, expand_cells(definition)):
        name, done = record["name"], record["status"] == "done"
        there = earlier.get(name)
        there_done = there is not None and there["status"] == "done"
        if done:
            copied.append(name)
            if not there_done:
                new.append(name)
        else:
            left_out.append(name)
            if not there_done:
                continue  # the copy holds no unfinished cell
            kept.append(name)
            record = there
        text = relative_text(json.dumps(record, ensure_ascii=False), relative_to)
        records.append({**json.loads(text), "published": True})
    return CopyPlan(plan_text, records, copied, new, left_out, kept)


def write_copy(plan: CopyPlan, dest: str | Path) -> None:
    """Write ``cells.csv`` and then ``plan.json`` of ``plan`` into ``dest``, each atomically."""
    dest = Path(dest)
    make_folder(dest)
    write_cells_csv(dest / CELLS_CSV, plan.records)
    atomic_write_text(dest / PLAN_FILE, plan.plan_text)


def _check_same_study(definition: dict[str, Any], dest: Path, relative_to: str | Path) -> None:
    """Refuse a ``dest`` whose ``plan.json`` defines another study."""
    there = read_plan(dest) if os.path.lexists(dest / PLAN_FILE) else None
    if there is None:
        return
    difference = first_difference(there["definition"], definition)
    if difference is not None:
        raise ConfigError(
            f"{dest / PLAN_FILE} is the copy of another study (definition {difference}, that copy's value first; "
            f"absolute paths under {os.path.abspath(relative_to)} are written relative to it): publish into a new "
            "folder, or run from the folder the earlier copy was made from."
        )
