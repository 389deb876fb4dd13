"""A study's published copy: the small files of its done cells, enough to redraw every table and figure.

``detr-peg plot STUDY --publish DEST`` (:func:`publish_study`) copies into
``DEST``:

* ``plan.json``;
* for every cell whose ``cell.json`` says ``done``, its folder (``cell.json``,
  ``cell.log``, ``run/`` and ``eval/``) without what is large or belongs to a
  live process: checkpoints (``*.pth``, ``*.safetensors``), detections
  (``detections.json``) and hidden files (locks, temporary files), except
  the folders' ownership records (``.detr-peg-outputs.json``), which let a
  later ``detr-peg study`` or ``plot`` write into the copy.

Cells not done are left out (their results are not there yet); cells already
in ``DEST`` stay, so publishing again adds the cells done since. In every
text file, absolute paths under ``relative_to`` (the current folder) are
written relative to it, so the copy names no machine's folders. ``DEST``
holding another study's copy (a different definition in its ``plan.json``) is
refused, naming the first difference. The report itself (``study.md``,
``study.json``, ``study.csv``, ``plots/``) is then drawn from the copy by
``detr-peg plot``, so it holds exactly what the copy does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detr_peg.errors import ConfigError, OutputError
from detr_peg.fileio.atomic import atomic_write
from detr_peg.fileio.os_errors import os_error_reason, write_error
from detr_peg.guards.output_guard import OWNERSHIP_FILE
from detr_peg.study.cell import cell_paths, first_difference, read_state
from detr_peg.study.grid import StudyDefinition, expand_cells
from detr_peg.study.stored_files import PLAN_FILE, read_plan

#: Suffixes and names of the files a published copy leaves out (besides hidden files).
LEFT_OUT_SUFFIXES = (".pth", ".safetensors")
LEFT_OUT_NAMES = ("detections.json",)


@dataclass(frozen=True)
class Published:
    """What :func:`publish_study` did.

    Attributes:
        copied: the done cells copied (names), in the plan's order.
        new: those of them that the copy did not hold before.
        left_out: the cells of the plan that are not done (not copied).
    """

    copied: list[str]
    new: list[str]
    left_out: list[str]


def is_published(path: Path) -> bool:
    """Whether a file of a cell's folder belongs in the published copy (``path`` relative to the cell)."""
    name = path.name
    if name.startswith("."):
        return name == OWNERSHIP_FILE
    return name not in LEFT_OUT_NAMES and path.suffix not in LEFT_OUT_SUFFIXES


def relative_text(text: str, relative_to: Path) -> str:
    """``text`` with every absolute path under ``relative_to`` written relative to it."""
    prefix = str(relative_to.resolve()).rstrip(os.sep) + os.sep
    return text.replace(prefix, "") if len(prefix) > 1 else text


def publish_study(source: str | Path, dest: str | Path, relative_to: str | Path = ".") -> Published:
    """Copy the done cells of study folder ``source`` and its ``plan.json`` into ``dest`` (see the module).

    Raises:
        ConfigError: ``source`` has no ``plan.json``, or ``dest`` holds another study's.
        DamagedFileError: a ``plan.json`` or ``cell.json`` that cannot be read as one.
        OutputError: a file of ``source`` that cannot be read, or of ``dest`` that cannot be written.
    """
    source, dest, root = Path(source), Path(dest), Path(relative_to)
    plan, plan_text = check_publishable(source, dest, root)
    definition = StudyDefinition.from_dict(plan["definition"])
    copied, new, left_out = [], [], []
    for cell in expand_cells(definition):
        paths = cell_paths(source, cell)
        state = read_state(paths)
        if state is None or state.get("status") != "done":
            left_out.append(cell.name)
            continue
        target = cell_paths(dest, cell).root
        if not os.path.lexists(target / paths.state.name):
            new.append(cell.name)
        for file in _cell_files(paths.root):
            _copy(file, target / file.relative_to(paths.root), root)
        copied.append(cell.name)
    _write(dest / PLAN_FILE, plan_text.encode("utf-8"))
    return Published(copied, new, left_out)


def check_publishable(
    source: str | Path, dest: str | Path, relative_to: str | Path = "."
) -> tuple[dict[str, Any], str]:
    """Refuse what :func:`publish_study` would refuse, before anything is written; returns the source's plan and
    the text of its copy (paths made relative).

    Raises:
        ConfigError: ``source`` has no ``plan.json``, or ``dest`` holds another study's.
        DamagedFileError: a ``plan.json`` that cannot be read as one.
    """
    source, dest = Path(source), Path(dest)
    plan = read_plan(source)
    if plan is None:
        raise ConfigError(f"{source} is not a study folder (no {PLAN_FILE}); give the folder detr-peg study wrote.")
    plan_text = relative_text(_read_bytes(source / PLAN_FILE).decode("utf-8"), Path(relative_to))
    there = read_plan(dest) if os.path.lexists(dest / PLAN_FILE) else None
    if there is None:
        return plan, plan_text
    difference = first_difference(there["definition"], json.loads(plan_text)["definition"])
    if difference is not None:
        raise ConfigError(
            f"{dest / PLAN_FILE} is the copy of another study (definition {difference}, that copy's value first); "
            "publish into a new folder, or delete that copy first."
        )
    return plan, plan_text


def _cell_files(folder: Path) -> Iterator[Path]:
    """The files of a cell's folder that a published copy holds, in a stable order."""
    try:
        entries = sorted(folder.rglob("*"))
    except OSError as exc:
        raise OutputError(f"Could not read {folder}: {os_error_reason(exc)}.") from None
    for path in entries:
        relative = path.relative_to(folder)
        if path.is_file() and not path.is_symlink() and all(is_published(Path(part)) for part in relative.parts):
            yield path


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OutputError(f"Could not read {path}: {os_error_reason(exc)}.") from None


def _copy(source: Path, target: Path, root: Path) -> None:
    data = _read_bytes(source)
    try:
        data = relative_text(data.decode("utf-8"), root).encode("utf-8")
    except UnicodeDecodeError:
        pass  # not text: copied as it is
    _write(target, data)


def _write(target: Path, data: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(target.parent, exc, "create") from None
    atomic_write(target, lambda handle: handle.write(data))
