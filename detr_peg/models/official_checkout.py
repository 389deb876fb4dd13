"""Importing an architecture's official implementation from a local checkout (``bench --official PATH``); each
such case runs in its own process, so the official top-level ``models``/``util`` never meet ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

from detr_peg.errors import ConfigError
from detr_peg.models.registry import OfficialCode


def check_checkout(path: str, official: OfficialCode, arch: str) -> None:
    """Raise a :class:`ConfigError` unless ``path`` is a checkout of ``official.repository``."""
    if not (Path(path) / official.marker).is_file():
        raise ConfigError(
            f"--official {path} does not look like the official repository of {arch} "
            f"(no {official.marker}); point it at a checkout of github.com/{official.repository}."
        )


def import_checkout(path: str, official: OfficialCode, arch: str) -> None:
    """Make the checkout at ``path`` importable (its top-level ``models``, ``util``, ``main``)."""
    check_checkout(path, official, arch)
    sys.path.insert(0, str(Path(path).resolve()))


def official_args(get_args_parser, argv: list[str]):
    """The official script's arguments for ``argv`` (on the CPU unless ``argv`` says otherwise)."""
    return get_args_parser().parse_args(["--device", "cpu", *argv])
