"""Load, compose, override, validate and save configs.

Composition: a YAML file may name one or more parent files under ``_base_``
(paths relative to the file); parents are merged first, then the file itself,
then ``key=value`` overrides from the command line. Under everything lie the
dataclass defaults of :mod:`detr_peg.config.schema` and the per-architecture
defaults of :mod:`detr_peg.config.defaults` for the resolved ``model.arch``.

Every value is checked against the dataclass field it lands in. An unknown key,
a value of the wrong type or a malformed override is a
:class:`~detr_peg.errors.ConfigError` naming the source (file or
"command line"), the dotted key and the value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Union

import yaml

from detr_peg.config.defaults import ARCH_DEFAULTS
from detr_peg.config.schema import Config
from detr_peg.errors import ConfigError

BASE_KEY = "_base_"

# A flattened config layer: dotted key -> (value, source).
Layer = dict[str, tuple[Any, str]]


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    *,
    base: Mapping[str, Any] | None = None,
    base_source: str = "checkpoint",
) -> Config:
    """Build a validated :class:`Config`.

    Args:
        path: YAML config file, or ``None`` for defaults only.
        overrides: ``"dotted.key=value"`` strings; values are parsed as YAML
            (``train.lr=2e-4``, ``model.position.peg_layers=[0,1]``).
        base: a nested dict applied under the file (for example the config
            stored in a checkpoint).
        base_source: how ``base`` is named in error messages.

    Returns:
        The resolved config.

    Raises:
        ConfigError: missing or unreadable file, invalid YAML, unknown key,
            wrong type, bad override syntax or unknown architecture.
    """
    layers: list[Layer] = []
    if base is not None:
        layers.append(_flatten(base, base_source))
    if path is not None:
        layers.extend(_read_file_layers(Path(path), seen=()))
    layers.append(parse_overrides(overrides))
    return build_config(layers)


def file_layers(path: str | os.PathLike) -> list[Layer]:
    """The flattened layers of a config file and its ``_base_`` parents, parents first."""
    return _read_file_layers(Path(path), seen=())


def dotted_layer(values: Mapping[str, Any], source: str) -> Layer:
    """A layer from ``{"dotted.key": value}`` pairs, all attributed to ``source``."""
    return {key: (value, source) for key, value in values.items()}


def config_from_dict(data: Mapping[str, Any], source: str = "config") -> Config:
    """Validate a nested dict (as written by :func:`config_to_dict`) into a Config."""
    return build_config([_flatten(data, source)])


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts, lists and scalars (safe to pickle or dump)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (atomically: temporary file then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a partial file behind
        raise


def parse_overrides(overrides: Iterable[str], source: str = "command line") -> Layer:
    """Parse ``key=value`` strings into a layer (values are YAML scalars or lists)."""
    layer: Layer = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"{source}: override {item!r} is not of the form key=value "
                "(for example train.lr=2e-4)."
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        layer.update(_flatten({key: value} if "." not in key else _nest(key, value), source))
    return layer


def build_config(layers: list[Layer]) -> Config:
    """Merge flattened layers over the defaults of the resolved architecture."""
    merged: Layer = {}
    for layer in layers:
        merged.update(layer)
    arch, arch_source = merged.get("model.arch", ("detr", "defaults"))
    if arch not in ARCH_DEFAULTS:
        valid = ", ".join(repr(a) for a in sorted(ARCH_DEFAULTS))
        raise ConfigError(f"{arch_source}: unknown model.arch {arch!r}: valid are {valid}.")
    merged = {**_flatten(ARCH_DEFAULTS[arch], f"defaults of {arch}"), **merged}

    cfg = Config()
    for key, (value, source) in merged.items():
        owner, name, hint = _resolve(cfg, key, source)
        setattr(owner, name, _coerce(value, hint, key, source))
    return cfg


# --------------------------------------------------------------------------- files


def _read_file_layers(path: Path, seen: tuple[Path, ...]) -> list[Layer]:
    source = str(path)
    if not path.is_file():
        raise ConfigError(f"Config file {source} does not exist.")
    resolved = path.resolve()
    if resolved in seen:
        raise ConfigError(f"{source}: '_base_' files include each other in a cycle.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"Config file {source} cannot be read: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        # safe_load refuses Python tags (!!python/object/apply:...); the problem text says so.
        problem = getattr(exc, "problem", None)
        detail = f" ({problem})" if problem else ""
        raise ConfigError(f"{source}: invalid YAML{where}{detail}.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config file must hold a mapping of sections, not {type(data).__name__}.")
    bases = data.pop(BASE_KEY, [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{source}: '{BASE_KEY}' must be a file path or a list of file paths.")
    layers: list[Layer] = []
    for base in bases:
        layers.extend(_read_file_layers(path.parent / base, seen + (resolved,)))
    layers.append(_flatten(data, source))
    return layers


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _flatten(data: Mapping[str, Any], source: str, prefix: str = "", node: Any = None) -> Layer:
    """Flatten nested dicts into dotted keys, descending only into config sections."""
    node = Config() if node is None else node
    out: Layer = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {key!r} under '{prefix or 'top level'}' is not a string.")
        dotted = f"{prefix}{key}"
        child = getattr(node, key, None) if dataclasses.is_dataclass(node) else None
        if dataclasses.is_dataclass(child):
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"{source}: '{dotted}' is a section and needs a mapping of keys, got {value!r}."
                )
            out.update(_flatten(value, source, dotted + ".", child))
        else:
            out[dotted] = (value, source)
    return out


# ------------------------------------------------------------------ validation


def _resolve(cfg: Config, key: str, source: str) -> tuple[Any, str, Any]:
    owner: Any = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(owner)]
        if part not in names:
            section = ".".join(parts[:depth]) or "the top level"
            valid = ", ".join(names)
            raise ConfigError(f"{source}: unknown key '{key}'; valid keys in {section} are: {valid}.")
        if depth < len(parts) - 1:
            owner = getattr(owner, part)
            if not dataclasses.is_dataclass(owner):
                raise ConfigError(f"{source}: unknown key '{key}'; '{'.'.join(parts[:depth + 1])}' is not a section.")
    hints = typing.get_type_hints(type(owner))
    if dataclasses.is_dataclass(getattr(owner, parts[-1])):
        raise ConfigError(f"{source}: '{key}' is a section and needs a mapping of keys.")
    return owner, parts[-1], hints[parts[-1]]


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        (item,) = typing.get_args(hint)
        return f"a list of {_type_name(item)}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    def fail() -> ConfigError:
        return ConfigError(f"{source}: '{key}' must be {_type_name(hint)}, got {value!r}.")

    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError:
                pass
        raise fail()
    if origin is Literal:
        if value in typing.get_args(hint) and type(value) is not bool:
            return value
        raise fail()
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise fail()
        try:
            return [_coerce(v, item, key, source) for v in value]
        except ConfigError:
            raise fail() from None
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail()
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                parsed = float(value)
            except ValueError:
                raise fail() from None
            if math.isfinite(parsed):
                return parsed
        raise fail()
    if hint is str:
        if isinstance(value, str):
            return value
        raise fail()
    raise TypeError(f"unsupported config type {hint!r} for {key}")
