"""A study's definition and its cells: base configs x grid axes x seeds (a setting is a cell without its seed)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from detr_peg.errors import ConfigError
from detr_peg.lab.study.records import message_only, record
from detr_peg.messages import shortened

#: Characters kept in cell folder names; anything else becomes "-".
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9.=_+-]+")


@dataclass(frozen=True)
class Axis:
    """One grid axis: a dotted config key and each value's raw text (``[0,1,2]``); ``source`` words messages only."""

    key: str
    values: tuple[str, ...]
    source: str = message_only("--grid")


@dataclass(frozen=True)
class EvalPlan:
    """Evaluation beyond the validation size: ``scales`` (resized), ``canvas_scales`` (larger canvas), ``padding``."""

    scales: tuple[float, ...] = ()
    canvas_scales: tuple[float, ...] = ()
    padding: bool = False

    @property
    def needed(self) -> bool:
        """Whether a separate evaluation step runs."""
        return bool(self.scales or self.canvas_scales or self.padding)


@dataclass(frozen=True)
class StudyDefinition:
    """Everything that decides a study's cells (recorded in ``plan.json``); ``overrides`` apply after axis values."""

    configs: tuple[str, ...]
    axes: tuple[Axis, ...] = ()
    seeds: int = 1
    overrides: tuple[str, ...] = ()
    eval: EvalPlan = field(default_factory=EvalPlan)
    #: (key, where it was given) of overrides not from the command line, for messages.
    override_sources: tuple[tuple[str, str], ...] = message_only(())

    def to_dict(self) -> dict[str, Any]:
        return record(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyDefinition:
        ev = data.get("eval") or {}
        return cls(
            configs=tuple(data["configs"]),
            axes=tuple(Axis(a["key"], tuple(a["values"])) for a in data.get("axes", [])),
            seeds=int(data.get("seeds", 1)),
            overrides=tuple(data.get("overrides", [])),
            eval=EvalPlan(
                scales=tuple(ev.get("scales", ())),
                canvas_scales=tuple(ev.get("canvas_scales", ())),
                padding=bool(ev.get("padding", False)),
            ),
        )


@dataclass(frozen=True)
class Cell:
    """One training run: ``name`` (its folder), ``setting`` (name without seed), ``overrides`` (axes, study, seed)."""

    name: str
    setting: str
    config: str
    values: tuple[tuple[str, str], ...]
    seed: int
    overrides: tuple[str, ...]
    sources: tuple[tuple[str, str], ...] = message_only(())


# ----------------------------------------------------------------------------- parsing


def split_values(text: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes (``"[0],[0,1,2]"``: two values); ``ConfigError`` if bad."""
    values, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"grid values {text!r}: a closing bracket at position {i + 1} has no opening one.")
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    if depth or quote:
        raise ConfigError(f"grid values {text!r}: a bracket or quote is not closed.")
    values.append(text[start:].strip())
    if any(v == "" for v in values):
        raise ConfigError(f"grid values {text!r}: an empty value (two commas in a row, or one at an end).")
    return values


def parse_axis(text: str, source: str = "--grid") -> Axis:
    """``"KEY=V1,V2,..."`` as an :class:`Axis`; ``ConfigError`` for no ``=``, no key, repeated or invalid values."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ConfigError(
            f"{source} {text!r} is not of the form KEY=V1,V2,... (for example model.position.name=sine,peg)."
        )
    values = split_values(raw)
    parsed = [_parse_value(key, v, source) for v in values]
    for i, value in enumerate(parsed):
        if value in parsed[:i]:
            raise ConfigError(f"{source} {key}: the value {values[i]!r} is given twice.")
    return Axis(key, tuple(values), source)


#: The most cells a study may have (each one is a training run; the plan lists them all).
MAX_CELLS = 10_000


def parse_seeds(text: str) -> int:
    try:
        seeds = int(text)
    except ValueError:
        seeds = 0
    if seeds < 1:
        raise ConfigError(f"--seeds must be a whole number of at least 1, got {text!r}.")
    return seeds


def check_distinct_axes(axes: Sequence[Axis]) -> None:
    """Raise ``ConfigError`` for two axes of one key."""
    seen: set[str] = set()
    for axis in axes:
        if axis.key in seen:
            raise ConfigError(f"{axis.source} {axis.key} is given twice; list all its values in one {axis.source}.")
        seen.add(axis.key)


def _parse_value(key: str, raw: str, source: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"{source} {key}: the value {raw!r} is not valid YAML.") from None


# ----------------------------------------------------------------------------- cells


#: Config keys the study sets in every cell, and by what: never an axis or an override.
SET_BY_STUDY = {
    "train.seed": "--seeds (seeds 0..N-1)",
    "train.output_dir": "the study (each cell trains in cells/NAME/run)",
    "train.resume": "the study (a stopped cell resumes from its own checkpoint)",
}


def expand_cells(definition: StudyDefinition) -> list[Cell]:
    """Every cell: base configs x axis values x seeds, in that nesting order (``..._position.name=peg_seed1``).

    Raises ``ConfigError``: duplicate axis keys, an axis also overridden, or cells sharing a folder.
    """
    check_distinct_axes(definition.axes)
    keys = [a.key for a in definition.axes]
    fixed = {o.partition("=")[0].strip() for o in definition.overrides}
    for key in keys:
        if key in fixed:
            raise ConfigError(f"{key} is both a grid axis and a fixed override; keep one of them.")
    for key, by in SET_BY_STUDY.items():
        if key in keys or key in fixed:
            raise ConfigError(f"{key} is set by {by}; do not set it as an override or axis.")

    total = len(definition.configs) * math.prod(len(a.values) for a in definition.axes) * definition.seeds
    if total > MAX_CELLS:
        raise ConfigError(
            f"The study has {total:,} cells ({len(definition.configs)} configs x "
            f"{' x '.join(str(len(a.values)) for a in definition.axes) or '1'} settings x {definition.seeds} seeds), "
            f"more than the {MAX_CELLS:,} accepted; each cell is a training run."
        )
    labels = _axis_labels(keys)
    stems = _config_labels(definition.configs)
    cells = []
    for config, stem in zip(definition.configs, stems):
        for combo in itertools.product(*(a.values for a in definition.axes)):
            values = tuple(zip(keys, combo))
            parts = ([stem] if len(definition.configs) > 1 else []) + [
                f"{label}={_safe(v)}" for label, v in zip(labels, combo)
            ]
            setting = "_".join(parts) or Path(config).stem
            for seed in range(definition.seeds):
                overrides = (*(f"{k}={v}" for k, v in values), *definition.overrides, f"train.seed={seed}")
                cells.append(
                    Cell(
                        name=f"{setting}_seed{seed}",
                        setting=setting,
                        config=config,
                        values=values,
                        seed=seed,
                        overrides=overrides,
                        sources=(*definition.override_sources, *((a.key, a.source) for a in definition.axes)),
                    )
                )
    check_cell_folders(cells)
    return cells


def run_order(cells: Sequence[Cell]) -> list[Cell]:
    """The cells seed by seed (every setting's seed 0, then seed 1, ...), so a stopped study holds whole seeds."""
    return sorted(cells, key=lambda cell: cell.seed)


#: The longest name of a folder on the common file systems (ext4, xfs, btrfs, tmpfs, APFS, NTFS), in bytes.
MAX_NAME_BYTES = 255


def check_cell_folders(cells: Sequence[Cell]) -> None:
    """Raise ``ConfigError`` for two cells whose folder names read alike, or a name over :data:`MAX_NAME_BYTES`."""

    def described(cell: Cell) -> str:
        values = ", ".join(f"{k}={shortened(v, 40)}" for k, v in cell.values)
        return f"{cell.config}" + (f" with {values}" if values else "")

    first: dict[str, Cell] = {}
    for cell in cells:
        size = len(cell.name.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise ConfigError(
                f"The cell {described(cell)} would be the folder {shortened(cell.name)} ({size} bytes), longer than "
                f"the {MAX_NAME_BYTES} bytes a folder name may have; use shorter grid values (a config file "
                "per long value, say)."
            )
        if cell.name in first:
            raise ConfigError(
                f"Two cells would share the folder {cell.name}: {described(first[cell.name])} and "
                f"{described(cell)}; give each config once and grid values that differ in letters or digits."
            )
        first[cell.name] = cell


def _axis_labels(keys: Sequence[str]) -> list[str]:
    """Each key without its section (``model.position.name`` -> ``position.name``, ``train.lr`` -> ``lr``)."""
    short = [k.split(".", 1)[-1] for k in keys]
    return [s if short.count(s) == 1 else k for s, k in zip(short, keys)]


def _config_labels(configs: Sequence[str]) -> list[str]:
    stems = [Path(c).stem for c in configs]
    if len(set(stems)) == len(stems):
        return stems
    return [_safe(str(Path(c).with_suffix(""))) for c in configs]


def _safe(text: str) -> str:
    return _NAME_UNSAFE.sub("-", text).strip("-") or "empty"
