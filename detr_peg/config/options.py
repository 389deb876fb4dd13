"""What each architecture (an :class:`ArchitectureSchema`) and positional encoding (a ``PositionConfig``
subclass) adds to the config. The model modules register them on import; this layer never imports the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from detr_peg.config.schema import Config, PositionConfig
from detr_peg.registry import Registry

#: Dotted paths of the sections an architecture may extend.
EXTENSIBLE_SECTIONS = ("model", "model.transformer", "model.backbone", "loss", "data", "train", "eval")


@dataclass(frozen=True)
class ArchitectureSchema:
    """The config fields and defaults of one detector family.

    ``sections`` maps a dotted section path (in :data:`EXTENSIBLE_SECTIONS`) to a dataclass subclassing the shared
    section with the family's own fields; ``defaults`` is nested ``{section: {key: value}}`` of shared fields
    whose default differs (``{"model": {"num_queries": 300}}``).
    """

    sections: Mapping[str, type] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path, cls in self.sections.items():
            if path not in EXTENSIBLE_SECTIONS:
                raise ValueError(f"section {path!r} cannot be extended; extensible are {EXTENSIBLE_SECTIONS}")
            base = type(section_of(Config(), path))
            if not (isinstance(cls, type) and issubclass(cls, base) and dataclasses.is_dataclass(cls)):
                raise ValueError(f"the class for section {path!r} must be a dataclass subclassing {base.__name__}")


ARCHITECTURE_SCHEMAS: Registry = Registry(
    "model architecture",
    """The config schema of each ``model.arch``: an :class:`ArchitectureSchema`.""",
)

ENCODING_OPTIONS: Registry = Registry(
    "positional encoding",
    """The options of each ``model.position.name``: a dataclass subclassing ``PositionConfig``.""",
)


def register_architecture_schema(name: str, schema: ArchitectureSchema) -> None:
    """Register the config schema of architecture ``name`` (done by the model registry)."""
    ARCHITECTURE_SCHEMAS.register(name)(schema)


def register_encoding_options(name: str, options: type[PositionConfig]) -> None:
    """Register the options class of encoding ``name`` (done by the encoding registry)."""
    if not (isinstance(options, type) and issubclass(options, PositionConfig) and dataclasses.is_dataclass(options)):
        raise ValueError(f"the options of encoding {name!r} must be a dataclass subclassing PositionConfig")
    ENCODING_OPTIONS.register(name)(options)


def section_of(node: Any, path: str) -> Any:
    """The section at dotted ``path`` of a config (``""`` is the config itself)."""
    for part in filter(None, path.split(".")):
        node = getattr(node, part)
    return node


def new_config(arch: str, encoding: str) -> Config:
    """A config of dataclass defaults with the sections of registered ``arch`` and ``encoding``."""
    cfg = Config()
    sections = dict(ARCHITECTURE_SCHEMAS.get(arch).sections)
    sections["model.position"] = ENCODING_OPTIONS.get(encoding)
    # Outer sections first: replacing ``model`` creates fresh inner sections that are replaced next.
    for path in sorted(sections, key=lambda p: p.count(".")):
        parent, _, name = path.rpartition(".")
        setattr(section_of(cfg, parent), name, sections[path]())
    cfg.model.position.name = encoding
    cfg.model.arch = arch
    return cfg


def own_options(cfg: Config) -> dict[str, Any]:
    """The fields ``cfg``'s architecture adds to the shared sections, by dotted key (``model.with_box_refine``)."""
    shared = Config()
    options = {}
    for path in ARCHITECTURE_SCHEMAS.get(cfg.model.arch).sections:
        section, base = section_of(cfg, path), section_of(shared, path)
        for f in dataclasses.fields(section):
            if f.name not in _field_names(type(base)) and not dataclasses.is_dataclass(getattr(section, f.name)):
                options[f"{path}.{f.name}"] = getattr(section, f.name)
    return options


def owners_of(key: str) -> list[str]:
    """Registered owners of dotted ``key`` (``"model.arch 'deformable_detr'"``); empty if none has it."""
    section, _, name = key.rpartition(".")
    owners = []
    for arch in ARCHITECTURE_SCHEMAS.names():
        cls = ARCHITECTURE_SCHEMAS.get(arch).sections.get(section)
        if cls is not None and name in _field_names(cls):
            owners.append(f"model.arch {arch!r}")
    if section == "model.position":
        for encoding in ENCODING_OPTIONS.names():
            if name in _field_names(ENCODING_OPTIONS.get(encoding)):
                owners.append(f"model.position.name {encoding!r}")
    return owners


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
