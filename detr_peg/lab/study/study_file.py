"""Study files: a study's definition as YAML (only ``configs`` required; paths relative to the file)::

    configs: [../detr_r50_sine.yaml, ../deformable_detr_r50_peg.yaml]   # an axis of the grid
    grid: {model.position.peg_layers: [[0], [0, 1, 2]]}                 # more axes
    seeds: 3                       # or auto (with target_ci, max_seeds)
    baseline: model.position.name=sine
    equal_within: 1.0              # AP points
    overrides: [train.eval_every=5]
    eval: {scales: [1.0, 1.5], canvas_scales: [1.5, 2.0], padding: true}
    cluster: {nodes: 1, gpus_per_node: 8, time: "72:00:00"}

Command-line options add axes values and overrides, and replace seeds, eval and comparison options.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from detr_peg.bounded_read import decode_utf8, load_yaml_text, read_bounded_bytes, yaml_problem
from detr_peg.config.ranges import is_number, is_whole
from detr_peg.config.shipped import resolve_config
from detr_peg.errors import ConfigError

KNOWN_KEYS = (
    "configs",
    "grid",
    "seeds",
    "target_ci",
    "max_seeds",
    "baseline",
    "equal_within",
    "overrides",
    "eval",
    "cluster",
)
EVAL_KEYS = ("scales", "canvas_scales", "padding")
CLUSTER_KEYS = ("partition", "nodes", "gpus_per_node", "time", "cpus_per_task", "mem")


@dataclass
class StudyFile:
    """The raw fields of a study file, checked for type (the grid values as override text)."""

    configs: list[str] = field(default_factory=list)
    grid: list[str] = field(default_factory=list)  # "KEY=V1,V2" as on the command line
    seeds: int | str | None = None  # a number, or "auto"
    target_ci: float | None = None
    max_seeds: int | None = None
    overrides: list[str] = field(default_factory=list)
    eval: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
    comparison: dict[str, Any] = field(default_factory=dict)  # baseline, equal_within


def load_study_file(path: str | Path) -> StudyFile:
    """Read and check a study file; ``ConfigError`` for a missing file, bad YAML, unknown key or wrongly typed value."""
    path = resolve_config(path)  # a file, or a shipped study's name (study/proxy_synthetic)
    # Bounded like every config file: a regular file of at most 1 MiB, UTF-8, YAML of bounded depth and size.
    raw = decode_utf8(read_bounded_bytes(path, "Study file", "config", ConfigError), path, "Study file", ConfigError)
    try:
        data = load_yaml_text(raw, path, "Study file", "config", ConfigError) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML{yaml_problem(exc)}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a study file holds a mapping (configs, grid, seeds, ...).")
    unknown = sorted(set(data) - set(KNOWN_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; valid are {', '.join(KNOWN_KEYS)}.")

    configs = data.get("configs", [])
    configs = [configs] if isinstance(configs, str) else configs
    if not isinstance(configs, list) or not all(isinstance(c, str) for c in configs):
        raise ConfigError(f"{path}: 'configs' must be a list of config file paths.")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"{path}: 'grid' must map each config key to a non-empty list of values.")
    seeds = data.get("seeds")
    if seeds is not None and seeds != "auto" and (not is_whole(seeds) or seeds < 1):
        raise ConfigError(f"{path}: 'seeds' must be a whole number of at least 1 or auto, got {seeds!r}.")
    top = _checked({k: data.get(k) for k in TOP_RULES}, "", path)
    rule_keys = [k for k in ("target_ci", "max_seeds") if k in top]
    if rule_keys and seeds != "auto":
        raise ConfigError(f"{path}: '{rule_keys[0]}' goes with 'seeds: auto' (seeds is {seeds!r}).")
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise ConfigError(f"{path}: 'overrides' must be a list of key=value strings.")
    return StudyFile(
        configs=[str(resolve_config(c, relative_to=path.parent).resolve()) for c in configs],
        grid=[f"{key}={','.join(_value_text(v) for v in values)}" for key, values in grid.items()],
        seeds=seeds,
        target_ci=top.get("target_ci"),
        max_seeds=top.get("max_seeds"),
        overrides=list(overrides),
        eval=_checked(_section(data, "eval", EVAL_KEYS, path), "eval", path),
        cluster=_checked(_section(data, "cluster", CLUSTER_KEYS, path), "cluster", path),
        comparison={k: top[k] for k in ("baseline", "equal_within") if k in top},
    )


def _positive_numbers(value: Any) -> bool:
    """A list of positive numbers, each once (``[1, 1.0]`` names one scale twice)."""
    return (
        isinstance(value, list)
        and all(is_number(v) and v > 0 for v in value)
        and all(v not in value[:i] for i, v in enumerate(value))
    )


def _whole_at_least_one(value: Any) -> bool:
    return is_whole(value) and value >= 1


#: What each key of the ``eval`` and ``cluster`` sections must hold: (check, description for the error).
FIELD_RULES = {
    "target_ci": (lambda v: is_number(v) and v > 0, "a positive number of AP points such as 1.0"),
    "max_seeds": (lambda v: _whole_at_least_one(v) and v >= 2, "a whole number of at least 2"),
    "baseline": (lambda v: isinstance(v, str) and "=" in v, "KEY=VALUE such as model.position.name=sine"),
    "equal_within": (lambda v: is_number(v) and v > 0, "a positive number of AP points such as 1.0"),
    "eval.scales": (_positive_numbers, "a list of positive numbers such as [1, 1.5, 2], each once"),
    "eval.canvas_scales": (_positive_numbers, "a list of positive numbers such as [1.5, 2], each once"),
    "eval.padding": (lambda v: isinstance(v, bool), "true or false"),
    "cluster.partition": (lambda v: isinstance(v, str) and v != "", "a partition name"),
    "cluster.nodes": (_whole_at_least_one, "a whole number of at least 1"),
    "cluster.gpus_per_node": (_whole_at_least_one, "a whole number of at least 1"),
    "cluster.cpus_per_task": (_whole_at_least_one, "a whole number of at least 1"),
    "cluster.time": (lambda v: isinstance(v, str) and v != "", "a SLURM time such as '72:00:00'"),
    "cluster.mem": (lambda v: isinstance(v, str) and v != "", "a SLURM memory size such as '64G'"),
}


#: The top-level keys checked by :data:`FIELD_RULES` (the paired comparisons and ``seeds: auto``).
TOP_RULES = ("target_ci", "max_seeds", "baseline", "equal_within")


def _checked(section: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    """``section`` after checking every key against :data:`FIELD_RULES` (null means the default)."""
    for key, value in section.items():
        dotted = f"{name}.{key}" if name else key
        check, valid = FIELD_RULES[dotted]
        if value is not None and not check(value):
            raise ConfigError(f"{path}: '{dotted}' must be {valid}, got {value!r}.")
    return {key: value for key, value in section.items() if value is not None}


def _section(data: dict, name: str, keys: tuple[str, ...], path: Path) -> dict[str, Any]:
    section = data.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: '{name}' must be a mapping with keys {', '.join(keys)}.")
    unknown = sorted(set(section) - set(keys))
    if unknown:
        raise ConfigError(f"{path}: unknown key '{name}.{unknown[0]}'; valid are {', '.join(keys)}.")
    return dict(section)


def _value_text(value: Any) -> str:
    """A YAML value as the text of a ``key=value`` override (JSON is YAML)."""
    if isinstance(value, str) and not any(ch in value for ch in ",[]{}'\""):
        return value
    return json.dumps(value, separators=(",", ":"))
