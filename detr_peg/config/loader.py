"""Load, compose (``_base_`` parents, then the file, then ``key=value`` overrides), validate and save configs.

Every value is checked against its field before anything is built; a problem is a
:class:`~detr_peg.errors.ConfigError` naming the source (file or "command line"), the dotted key and the value.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import types
import typing
from collections.abc import Collection, Iterable, Mapping
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from detr_peg.bounded_read import (
    ScalarText,
    check_regular_file,
    decode_utf8,
    load_yaml_text,
    plain,
    read_bounded_bytes,
    yaml_problem,
)
from detr_peg.config.options import ARCHITECTURE_SCHEMAS, ENCODING_OPTIONS, new_config, owners_of
from detr_peg.config.ranges import is_number, is_whole, out_of_range
from detr_peg.config.schema import Config
from detr_peg.config.shipped import missing_config_message, resolve_config
from detr_peg.errors import ConfigError
from detr_peg.outputs import atomic_write_text

logger = logging.getLogger(__name__)

BASE_KEY = "_base_"
CONFIG_OBJECT = "the Config object"  # how messages name a Config passed in Python

# A flattened config layer: dotted key -> (value, source).
Layer = dict[str, tuple[Any, str]]


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    *,
    base: Mapping[str, Any] | None = None,
    base_source: str = "checkpoint",
    sources: Mapping[str, str] | None = None,
    overrides_source: str = "command line",
) -> Config:
    """Build a validated :class:`Config` over the defaults of the resolved ``model.arch`` and encoding.

    Args:
        path: YAML config file or shipped config name (``detr_r50_peg``), or ``None`` for defaults only.
        overrides: ``"dotted.key=value"`` strings, values parsed as YAML (``model.position.peg_layers=[0,1]``).
        base: a stored config (:func:`config_to_dict`, as in a checkpoint) applied under the file; its fields the
            resolved architecture or encoding lacks are left out, so ``model.arch`` may change over it.
        base_source: how ``base`` is named in error messages.
        sources: per-key override sources for messages (``{"train.lr": "s.yaml: grid"}``).
        overrides_source: how messages name the other overrides' source.

    Raises:
        ConfigError: missing or unreadable file, invalid YAML, unknown key, option of another architecture or
            encoding, wrong type, value out of range or too large for this machine's memory, bad override syntax,
            or unknown architecture or encoding.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"config must be a config file's path or a shipped config's name, got {path!r}.")
    layers: list[Layer] = [] if base is None else [_flatten(base, base_source)]
    if path is not None:
        layers.extend(file_layers(path))
    layers.append(parse_overrides(overrides, overrides_source, sources=sources))
    return build_config(layers, lenient={0} if base is not None else ())


def file_layers(path: str | os.PathLike) -> list[Layer]:
    """The flattened layers of a config file (or shipped config name) and its ``_base_`` parents, parents first."""
    return _read_file_layers(resolve_config(path), (), set())


def dotted_layer(values: Mapping[str, Any], source: str) -> Layer:
    """A layer from ``{"dotted.key": value}`` pairs, all attributed to ``source``."""
    return {key: (value, source) for key, value in values.items()}


def config_from_dict(data: Mapping[str, Any], source: str = "config") -> Config:
    """Validate a stored nested dict (:func:`config_to_dict`); fields its architecture or encoding lacks are dropped."""
    return build_config([_flatten(data, source)], lenient={0})


def checked_config(cfg: Config, source: str = CONFIG_OBJECT) -> Config:
    """``cfg`` validated as a file's values are (a Config edited in Python skipped the loader); ConfigError."""
    try:
        data = config_to_dict(cfg)
    except (AttributeError, TypeError) as exc:  # a field deleted, or a section replaced by another type
        raise ConfigError(f"{source}: {exc}.") from None
    return config_from_dict(data, source)


def config_with(cfg: Config, values: Mapping[str, Any], source: str) -> Config:
    """``cfg`` with the dotted ``values`` set, each checked as an override from ``source`` is (ConfigError)."""
    return build_config([_flatten(config_to_dict(cfg), "config"), dotted_layer(values, source)], lenient={0})


def config_differences(cfg: Config, stored: Config, sections: tuple[str, ...] = ("model", "loss", "data")) -> list[str]:
    """Dotted keys within ``sections`` whose values differ, ignoring ``model.backbone.weights``."""
    a, b = config_to_dict(cfg), config_to_dict(stored)
    out: list[str] = []

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in x:
                walk(x[key], y.get(key), f"{prefix}.{key}" if prefix else key)
        elif x != y and prefix != "model.backbone.weights":
            out.append(prefix)

    for section in sections:
        walk(a[section], b[section], section)
    return out


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts, lists and scalars (safe to pickle or dump)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML atomically; ``OSError`` if unwritable or the disk is full (no partial file)."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(checked_config(cfg)), sort_keys=False))


def parse_overrides(
    overrides: Iterable[str], source: str = "command line", *, sources: Mapping[str, str] | None = None
) -> Layer:
    """Parse ``key=value`` strings into a layer; messages name ``sources[key]`` or else ``source``.

    A plain value YAML reads as a date, number, bool or null keeps its text (``ScalarText``), so a string field gets
    what the user wrote. Raises ``ConfigError`` for a string instead of a list, an item without ``=``, a key with an
    empty part, or a value giving a YAML key twice.
    """
    if isinstance(overrides, str):  # iterating it would give one override per character
        raise ConfigError(
            f"{source}: overrides are a list of key=value strings, got the string {overrides!r}; "
            f"pass a list: [{overrides!r}]."
        )
    layer: Layer = {}
    labels = {key.strip(): label for key, label in (sources or {}).items()}
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"{source}: overrides are key=value strings, got {item!r} ({type(item).__name__}).")
        key, sep, raw = item.partition("=")
        key = key.strip()
        given = labels.get(key, source)
        if not sep or not key:
            raise ConfigError(f"{given}: override {item!r} is not of the form key=value (for example train.lr=2e-4).")
        parts = key.split(".")
        if not all(part.strip() for part in parts):
            ends = {0: "starts with a dot", len(parts) - 1: "ends with a dot"}
            where = next((ends[i] for i in ends if not parts[i].strip()), "has two dots in a row")
            raise ConfigError(
                f"{given}: override {item!r} has an empty part in its key {key!r} (it {where}); "
                "keys are dotted names such as train.lr."
            )
        try:
            value = (
                load_yaml_text(raw, key, f"{given}: override", "config", ConfigError, keep_text=True)
                if raw.strip()
                else ScalarText(None, raw)
            )
        except yaml.YAMLError:
            value = raw
        layer.update(_flatten({key: value} if "." not in key else _nest(key, value), given))
    return layer


def build_config(layers: list[Layer], *, lenient: Collection[int] = ()) -> Config:
    """Merge flattened layers (later ones win) over the defaults of the resolved architecture and encoding.

    Keys of ``lenient`` layers (stored or derived configs) that the resolved architecture or encoding lacks are
    left out instead of refused.
    """
    merged: Layer = {}
    for layer in layers:
        merged.update(layer)
    arch = _registered(merged, "model.arch", "detr", ARCHITECTURE_SCHEMAS)
    encoding = _registered(merged, "model.position.name", "sine", ENCODING_OPTIONS)
    cfg = new_config(arch, encoding)
    defaults = _flatten(ARCHITECTURE_SCHEMAS.get(arch).defaults, f"defaults of {arch}")
    # Conditional defaults (the sine offset) and stored fields of another arch or encoding fall away.
    merged = {key: entry for key, entry in defaults.items() if _has_field(cfg, key)}
    # Options of another encoding or architecture set before the layer that chose this one (a PEG config's
    # peg_layers under model.position.name=sine, the demo's deformable options under model.arch=detr, a study cell
    # of a grid over encodings) are left out with a note.
    chosen = {"model.position.name": ("encoding", encoding), "model.arch": ("architecture", arch)}
    chooser = {name: max((i for i, layer in enumerate(layers) if name in layer), default=-1) for name in chosen}
    for index, layer in enumerate(layers):
        for key, entry in layer.items():
            by = "model.position.name" if key.startswith("model.position.") else "model.arch"
            superseded = index < chooser[by] and bool(owners_of(key))
            if (index in lenient or superseded) and not _has_field(cfg, key):
                note = "%s: left out '%s', an option of another %s than %s %r (%s)"
                if index not in lenient:
                    logger.info(note, entry[1], key, chosen[by][0], by, chosen[by][1], layers[chooser[by]][by][1])
            else:
                merged[key] = entry

    for key, (value, source) in merged.items():
        owner, name, hint = _resolve(cfg, key, source, arch, encoding)
        value = _coerce(value, hint, key, source)
        _check_range(owner, name, value, key, source)
        setattr(owner, name, value)
    _check_pairs(cfg, {key: src for key, (_, src) in merged.items()})
    return cfg


#: Keys that mean something only together, and what leaving both out means: a set of images without its
#: annotations (or the reverse) is refused rather than silently not used.
PAIRED_KEYS = {
    ("data.train_images", "data.train_annotations"): "a config without training data can evaluate and predict only",
    ("data.val_images", "data.val_annotations"): "a run without validation data does not evaluate",
}


def _check_pairs(cfg: Config, sources: Mapping[str, str]) -> None:
    for (first, second), without in PAIRED_KEYS.items():
        given = [key for key in (first, second) if _value(cfg, key) not in (None, "")]
        if len(given) == 1:
            (key,) = given
            other = second if key == first else first
            raise ConfigError(
                f"{key} is set ({sources.get(key, 'defaults')}) but {other} is not "
                f"({sources.get(other, 'defaults')}); set both, or neither ({without})."
            )


def _registered(merged: Layer, key: str, default: str, registry: Any) -> str:
    name, source = merged.get(key, (default, "defaults"))
    name = name.text if isinstance(name, ScalarText) else name
    if not isinstance(name, str) or name not in registry:
        if not len(registry):
            raise ConfigError(
                f"No {registry.name} is registered, so '{key}' cannot be checked: import detr_peg.models "
                "(which registers the built-in ones) or use detr_peg.load_config."
            )
        valid = ", ".join(repr(n) for n in registry.names())
        raise ConfigError(f"{source}: unknown {key} {name!r}: valid are {valid}.")
    return name


# --------------------------------------------------------------------------- files


def check_config_file(path: str | os.PathLike, named_by: str = "") -> None:
    """Raise ``ConfigError`` for a config path that is missing (after ``named_by``) or not a readable file."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(named_by + missing_config_message(path))
    check_regular_file(path, "Config file", "config", ConfigError)


def _read_file_layers(path: Path, seen: tuple[Path, ...], read: set[Path], named_by: str = "") -> list[Layer]:
    """``seen``: the files including this one; ``read``: all so far, a shared parent (a diamond) counts once."""
    source = str(path)
    check_config_file(path, named_by)
    raw = read_bounded_bytes(path, "Config file", "config", ConfigError)
    resolved = path.resolve()
    if resolved in seen:
        raise ConfigError(f"{source}: '_base_' files include each other in a cycle.")
    if resolved in read:  # applied again it would undo what the parents read since changed
        return []
    read.add(resolved)
    try:
        data = load_yaml_text(
            decode_utf8(raw, path, "Config file", ConfigError),
            path,
            "Config file",
            "config",
            ConfigError,
            keep_text=True,
        )
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML{yaml_problem(exc)}.") from None
    data = plain(data)  # a document that is one scalar
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config file must hold a mapping of sections, not {type(data).__name__}.")
    bases = plain(data.pop(BASE_KEY, []))
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{source}: '{BASE_KEY}' must be a file path or a list of file paths.")
    layers: list[Layer] = []
    for base in bases:
        # A parent is a path relative to this file, or the name of a shipped config (in copies of shipped configs).
        parent = resolve_config(base, relative_to=path.parent)
        layers.extend(_read_file_layers(parent, seen + (resolved,), read, f"{source}: its {BASE_KEY} {base!r}: "))
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
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(
                f"{source}: key {key!r} under '{prefix[:-1] or 'the top level'}' has an empty name "
                "(or an empty part between dots); keys are names such as lr under train."
            )
        dotted = f"{prefix}{key}"
        child = getattr(node, key, None) if dataclasses.is_dataclass(node) else None
        if dataclasses.is_dataclass(child):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: '{dotted}' is a section and needs a mapping of keys, got {value!r}.")
            out.update(_flatten(value, source, dotted + ".", child))
        else:
            out[dotted] = (value, source)
    return out


# ------------------------------------------------------------------ validation


def _has_field(cfg: Config, key: str) -> bool:
    section, _, name = key.rpartition(".")
    try:
        owner = attrgetter(section)(cfg) if section else cfg
    except AttributeError:
        return False
    return dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}


def _resolve(cfg: Config, key: str, source: str, arch: str, encoding: str) -> tuple[Any, str, Any]:
    owner: Any = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(owner)]
        if part not in names:
            owners = owners_of(key) if depth == len(parts) - 1 else []
            if owners:
                chosen = (
                    f"model.position.name {encoding!r}"
                    if owners[0].startswith("model.position")
                    else f"model.arch {arch!r}"
                )
                raise ConfigError(
                    f"{source}: '{key}' is an option of {' and '.join(owners)}, not of {chosen}; "
                    "remove it or choose one of those."
                )
            section = ".".join(parts[:depth]) or "the top level"
            valid = ", ".join(names)
            study = " (a study file's key: run it with detr-peg study --study)" if key in ("configs", "grid") else ""
            raise ConfigError(f"{source}: unknown key '{key}'{study}; valid keys in {section} are: {valid}.")
        if depth < len(parts) - 1:
            owner = getattr(owner, part)
            if not dataclasses.is_dataclass(owner):
                raise ConfigError(f"{source}: unknown key '{key}'; '{'.'.join(parts[: depth + 1])}' is not a section.")
    hints = typing.get_type_hints(type(owner))
    if dataclasses.is_dataclass(getattr(owner, parts[-1])):
        raise ConfigError(f"{source}: '{key}' is a section and needs a mapping of keys.")
    return owner, parts[-1], hints[parts[-1]]


def _check_range(owner: Any, name: str, value: Any, key: str, source: str) -> None:
    """A numeric value outside its field's range, a non-finite float or an empty list that needs an item is an error."""
    spec = next(f for f in dataclasses.fields(owner) if f.name == name)
    metadata = spec.metadata
    if value == [] and metadata.get("non_empty"):
        unset = " (leave it unset or null for the default)" if spec.default is None else ""
        raise ConfigError(f"{source}: '{key}' must hold at least one item, got []{unset}.")
    order, items = metadata.get("order"), value if isinstance(value, list) else None
    if order == "ascending" and items is not None and items != sorted(set(items)):
        raise ConfigError(f"{source}: '{key}' must be ascending without repeats, got {value!r}.")
    if order == "min_max" and items is not None and (len(items) != 2 or items[0] > items[1]):
        raise ConfigError(f"{source}: '{key}' must be [min, max] with min <= max, got {value!r}.")
    pattern = metadata.get("pattern")
    if pattern and isinstance(value, str) and not re.fullmatch(pattern[0], value):
        raise ConfigError(f"{source}: '{key}' must be {pattern[1]}, got {value!r}.")
    why = out_of_range(value, metadata.get("range"))
    if why is not None:
        raise ConfigError(f"{source}: '{key}' must be {why}, got {value!r}.")


def _value(cfg: Config, key: str) -> Any:
    return attrgetter(key)(cfg)


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


#: Numbers YAML 1.1 reads in another base than the decimal they look like: ``017`` is 15, ``1:30`` is 90.
_OCTAL_OR_BASE_60 = re.compile(r"[-+]?(0[0-7]+|[0-9]+(:[0-5]?[0-9])+(\.[0-9]*)?)")


def _check_base(raw: Any, hint: Any, key: str, source: str) -> None:
    """Refuse a number (or a list's) that YAML read in another base than the decimal it looks like."""
    if not {hint, *typing.get_args(hint), *(a for h in typing.get_args(hint) for a in typing.get_args(h))} & {
        int,
        float,
    }:
        return
    for item in (i for i in (raw if isinstance(raw, list) else [raw]) if isinstance(i, ScalarText)):
        looks = item.text.replace("_", "")
        if _OCTAL_OR_BASE_60.fullmatch(looks) and not (looks.lstrip("+-").isdigit() and int(looks) == item.value):
            raise ConfigError(f"{source}: '{key}' is {item.text}, which YAML reads as {item.value!r} (a leading 0 is "
                              "octal, ':' is base 60); write the number without them.")  # fmt: skip


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """``value`` as its field's type ``hint``, or a :class:`ConfigError` naming the key and value.

    A :class:`ScalarText` gives a string field the text the user wrote (``2001-12-14`` is a folder, not a date).
    """
    raw = value
    text = value.text if isinstance(value, ScalarText) else None
    value = plain(value)
    _check_base(raw, hint, key, source)

    def fail() -> ConfigError:
        shown = repr(value) if text is None else f"{text!r} (read as {value!r})"
        return ConfigError(f"{source}: '{key}' must be {_type_name(hint)}, got {shown}.")

    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(raw, arg, key, source)
            except ConfigError:
                pass
        raise fail()
    if origin is Literal:
        if text is not None and text in typing.get_args(hint):
            return text
        if value in typing.get_args(hint) and type(value) is not bool:
            return value
        raise fail()
    if origin is list:
        (item,) = typing.get_args(hint)
        items = raw.value if isinstance(raw, ScalarText) else raw
        if isinstance(items, tuple):
            items = list(items)
        if not isinstance(items, list):
            raise fail()
        try:
            return [_coerce(v, item, key, source) for v in items]
        except ConfigError:
            raise fail() from None
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    number = value
    # YAML 1.1 reads "1e-4" and "1e2" as strings (a string "4" is no integer).
    if hint in (int, float) and isinstance(value, str) and (hint is float or "e" in value.lower()):
        if not value.isascii():  # float() reads any script's digits ("１", "٣"); integers and options do not
            raise fail()
        try:
            number = float(value)
        except ValueError:
            raise fail() from None
        if not math.isfinite(number):
            raise fail()
    if hint is int:
        if is_whole(number):
            return int(number)
        if isinstance(number, float) and number.is_integer():
            return int(number)
        raise fail()
    if hint is float:
        if is_number(number, finite=False):
            return float(number)
        raise fail()
    if hint is str:
        if isinstance(value, (str, os.PathLike)):  # a Path set in Python
            return os.fsdecode(value)
        if text is not None and value is not None:
            return text
        raise fail()
    raise TypeError(f"unsupported config type {hint!r} for {key}")
