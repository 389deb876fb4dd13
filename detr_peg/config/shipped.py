"""The configs shipped with the package (the repository's ``configs/``, package data ``detr_peg/configs`` in the
wheel), and :func:`resolve_config`, the one rule every reader uses to find a config by path or by name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

import yaml

from detr_peg.errors import ConfigError

SUFFIXES = (".yaml", ".yml")
#: How a shipped config is named in messages and listings.
LIST_COMMAND = "detr-peg configs list"


def shipped_configs_dir() -> Path | None:
    """The folder of the shipped configs: ``detr_peg/configs`` when installed, ``configs/`` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "configs"
    if installed.is_dir():
        return installed
    # A checkout (or an editable install of one): the configs/ beside the package, in the project's own folder,
    # never a configs/ folder that another distribution left in site-packages.
    checkout = package.parent
    if (checkout / "configs").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "configs"
    return None


def shipped_names() -> list[str]:
    """The names of the shipped configs, sorted: ``demo``, ``detr_r50_peg``, ``study/proxy_synthetic``, ..."""
    root = shipped_configs_dir()
    if root is None:
        return []
    files = [p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in files)


def shipped_config(name: str | os.PathLike) -> Path | None:
    """The shipped config called ``name`` (with or without ``.yaml`` and a leading ``configs/``), or ``None``."""
    root = shipped_configs_dir()
    text = os.fsdecode(name).replace("\\", "/")
    if root is None or not text or os.path.isabs(text):
        return None
    parts = PurePosixPath(text).parts
    if parts and parts[0] == "configs":
        parts = parts[1:]
    if not parts or any(part in ("", ".", "..") for part in parts):
        return None
    relative = PurePosixPath(*parts)
    candidates = (
        [relative] if relative.suffix in SUFFIXES else [relative.with_name(relative.name + s) for s in SUFFIXES]
    )
    for candidate in candidates:
        path = root / candidate
        if path.is_file():
            return path
    return None


def resolve_config(spec: str | os.PathLike, relative_to: str | os.PathLike | None = None) -> Path:
    """The config file ``spec`` names: an existing file (relative to ``relative_to`` if given), else a shipped
    config of that name, else the path as given, which the reader reports as missing (or as a folder).
    """
    path = Path(spec) if relative_to is None else Path(relative_to) / spec
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        return path
    return shipped_config(spec) or path


def missing_config_message(path: str | os.PathLike) -> str:
    """The error for a config that is neither a file nor a shipped name (one sentence naming both ways out)."""
    return f"Config file {path} does not exist, and no shipped config has that name ({LIST_COMMAND} shows them)."


def references(data: object) -> list[str]:
    """The other config files a parsed config names: its ``_base_`` parents, or a study file's ``configs``."""
    if not isinstance(data, dict):
        return []
    found: list[str] = []
    for key in ("_base_", "configs"):
        value = data.get(key, [])
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        found += [v for v in values if isinstance(v, str)]
    return found


def portable_text(path: Path) -> str:
    """The text of shipped config ``path`` with the files it names rewritten as shipped names (``base/detr_r50``).

    Relative parent paths would break in a copy outside the package; comments and layout are kept.
    """
    root = shipped_configs_dir()
    text = path.read_text(encoding="utf-8")
    for reference in references(yaml.safe_load(text)):
        target = (path.parent / reference).resolve()
        if root is None or not target.is_file() or not target.is_relative_to(root.resolve()):
            continue
        name = target.relative_to(root.resolve()).with_suffix("").as_posix()
        text = re.sub(rf"(?<![\w./-]){re.escape(reference)}(?![\w./-])", name, text)
    return text


def require_shipped(name: str) -> Path:
    """The shipped config called ``name``; ``ConfigError`` listing the shipped configs if none is."""
    path = shipped_config(name)
    if path is None:
        names = shipped_names()
        valid = ", ".join(names) if names else "none are installed"
        raise ConfigError(f"No shipped config is named {str(name)!r}: valid are {valid}.")
    return path
