"""A study's published copy: the small files of its done cells, enough to redraw every table and figure.

``detr-peg plot STUDY --publish DEST`` (:func:`plan_copy`, then
:func:`write_copy`) copies into ``DEST``:

* ``plan.json``;
* for every cell whose ``cell.json`` says ``done``, its folder (``cell.json``,
  ``cell.log``, ``run/`` and ``eval/``) without what is large or belongs to a
  live process: model files (:data:`LEFT_OUT_SUFFIXES`), detections
  (``detections.json``) and hidden files (locks, temporary files), except
  the folders' ownership records (``.detr-peg-outputs.json``), which let a
  later ``detr-peg study`` or ``plot`` write into the copy. Symbolic links,
  and anything that is not a plain file or folder, are left out.

Cells not done are left out (their results are not there yet, so the copy's
report counts them as not started); cells already in ``DEST`` stay, so
publishing again adds the cells done since. In text files, absolute paths
under ``relative_to`` (the current folder) are written relative to it, so the
copy names no machine's folders; a path is rewritten only where it starts
(``/mnt/home/x`` stays as it is when the folder is ``/home``).

Everything that could refuse the copy is checked before the first file is
written (:func:`plan_copy`): the source's ``plan.json`` and every done
cell's ``cell.json`` read back against their shapes, every file to copy
readable, ``DEST`` holding no other study's copy and no symbolic link where a
cell's folder goes. The report itself (``study.md``, ``study.json``,
``study.csv``, ``plots/``) is then drawn from the copy by ``detr-peg plot``,
so it holds exactly what the copy does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detr_peg.errors import ConfigError, OutputError
from detr_peg.fileio.atomic import atomic_write
from detr_peg.fileio.os_errors import write_error
from detr_peg.guards.output_guard import OWNERSHIP_FILE
from detr_peg.lab.study.cell import CELLS_DIR, cell_paths, first_difference, read_state
from detr_peg.lab.study.grid import StudyDefinition, expand_cells
from detr_peg.lab.study.stored_files import PLAN_FILE, read_plan

#: Model files a published copy leaves out (besides ``detections.json`` and hidden files).
LEFT_OUT_SUFFIXES = (".pth", ".pt", ".ckpt", ".safetensors", ".onnx")
LEFT_OUT_NAMES = ("detections.json",)
#: Text files up to this size have their paths made relative; larger files are copied as they are.
TEXT_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class CopyPlan:
    """What :func:`write_copy` will write, all of it checked.

    Attributes:
        plan_text: the copy's ``plan.json`` (paths made relative).
        files: ``(source file, file in DEST)`` for every file of the done cells.
        copied: the done cells (names), in the plan's order.
        new: those of them that ``DEST`` did not hold before.
        left_out: the cells of the plan that are not done.
        kept: cells that ``DEST`` holds done from an earlier copy but the source no longer has done.
    """

    plan_text: str
    files: list[tuple[Path, Path]]
    copied: list[str]
    new: list[str]
    left_out: list[str]
    kept: list[str] = field(default_factory=list)


def is_published(path: Path) -> bool:
    """Whether a file named ``path`` (relative to its cell's folder) belongs in the published copy."""
    name = path.name
    if name.startswith("."):
        return name == OWNERSHIP_FILE
    return name not in LEFT_OUT_NAMES and path.suffix not in LEFT_OUT_SUFFIXES


def relative_text(text: str, relative_to: str | Path) -> str:
    """``text`` with every absolute path under ``relative_to`` written relative to it.

    Both the folder's absolute name and its resolved one (through symbolic
    links) count; a match counts only at the start of a path, not after a
    word character, ``.``, ``/``, ``~`` or ``-`` (``/mnt/home/x`` keeps its
    ``/home/`` when the folder is ``/home``).
    """
    for folder in {os.path.abspath(relative_to), str(Path(relative_to).resolve())}:
        prefix = folder.rstrip(os.sep) + os.sep
        if len(prefix) > 1:
            text = re.sub(r"(?<![\w./~-])" + re.escape(prefix), "", text)
    return text


def plan_copy(source: str | Path, dest: str | Path, relative_to: str | Path = ".") -> CopyPlan:
    """Check everything a copy of study ``source`` into ``dest`` needs, writing nothing (see the module).

    Raises:
        ConfigError: ``source`` has no ``plan.json``; ``dest`` holds another study's copy.
        DamagedFileError: a ``plan.json`` or ``cell.json`` that cannot be read as one.
        OutputError: a file of ``source`` that cannot be read, or a symbolic link where a cell's folder goes.
    """
    source, dest = Path(source), Path(dest)
    plan = read_plan(source)
    if plan is None:
        raise ConfigError(f"{source} is not a study folder (no {PLAN_FILE}); give the folder detr-peg study wrote.")
    plan_text = relative_text(_read_bytes(source / PLAN_FILE).decode("utf-8"), relative_to)
    _check_same_study(json.loads(plan_text)["definition"], dest, relative_to)
    files: list[tuple[Path, Path]] = []
    copied, new, left_out, kept = [], [], [], []
    for cell in expand_cells(StudyDefinition.from_dict(plan["definition"])):
        paths, target = cell_paths(source, cell), cell_paths(dest, cell)
        state = read_state(paths)
        if state is None or state.get("status") != "done":
            left_out.append(cell.name)
            there = read_state(target) if os.path.lexists(target.state) else None
            if there is not None and there.get("status") == "done":
                kept.append(cell.name)
            continue
        _check_no_link(dest, target.root)
        if not os.path.lexists(target.state):
            new.append(cell.name)
        files += [(file, target.root / file.relative_to(paths.root)) for file in _cell_files(paths.root)]
        copied.append(cell.name)
    return CopyPlan(plan_text, files, copied, new, left_out, kept)


def write_copy(plan: CopyPlan, dest: str | Path, relative_to: str | Path = ".") -> None:
    """Write the files of ``plan`` into ``dest``, each atomically, ``plan.json`` last.

    Raises:
        OutputError: a file that cannot be read or written (one sentence naming it).
    """
    for source, target in plan.files:
        _copy(source, target, relative_to)
    _write(Path(dest) / PLAN_FILE, plan.plan_text.encode("utf-8"))


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


def _check_no_link(dest: Path, folder: Path) -> None:
    """Refuse a symbolic link at, or on the way to, a cell's folder inside ``dest`` (writes would leave the copy)."""
    for part in (dest / CELLS_DIR, folder, folder / "run", folder / "eval"):
        if part.is_symlink():
            raise OutputError(
                f"{part} is a symbolic link; --publish writes only into folders of its own: remove the link "
                "or choose another folder."
            )


def _cell_files(folder: Path) -> list[Path]:
    """The plain files of a cell's folder that a published copy holds, sorted; each checked readable."""
    found = []

    def refuse(exc: OSError) -> None:
        raise _read_error(Path(exc.filename or folder), exc)

    for top, folders, names in os.walk(folder, onerror=refuse):
        folders[:] = sorted(f for f in folders if is_published(Path(f)) and not os.path.islink(os.path.join(top, f)))
        for name in sorted(names):
            path = Path(top, name)
            if is_published(path) and path.is_file() and not path.is_symlink():
                if not os.access(path, os.R_OK):
                    raise _read_error(path, PermissionError(13, "Permission denied"))
                found.append(path)
    return found


def _read_error(path: Path, exc: OSError) -> OutputError:
    reason = exc.strerror or str(exc)
    return OutputError(f"Could not read {path}: {reason}; the copy needs every file of the study's done cells.")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _read_error(path, exc) from None


def _copy(source: Path, target: Path, relative_to: str | Path) -> None:
    try:
        large = source.stat().st_size > TEXT_LIMIT
    except OSError as exc:
        raise _read_error(source, exc) from None
    if large:  # copied as it is, without holding it in memory
        _make_folder(target.parent)
        try:
            with open(source, "rb") as handle:
                atomic_write(target, lambda out: shutil.copyfileobj(handle, out))
        except OSError as exc:
            raise _read_error(source, exc) from None
        return
    data = _read_bytes(source)
    try:
        data = relative_text(data.decode("utf-8"), relative_to).encode("utf-8")
    except UnicodeDecodeError:
        pass  # not text: copied as it is
    _write(target, data)


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc, "create") from None


def _write(target: Path, data: bytes) -> None:
    _make_folder(target.parent)
    atomic_write(target, lambda handle: handle.write(data))
