"""Bounded reading: every file is checked before it is parsed, and its data before it is used (Rule 3 of
docs/guarantees.md). Limits per kind of file: :data:`LIMITS`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from detr_peg.errors import UserError
from detr_peg.messages import shortened
from detr_peg.outputs import path_obstacle

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """Bounds for one kind of file: bytes, and for parsed data nesting depth and values (aliases expanded)."""

    max_bytes: int
    max_depth: int = 64
    max_nodes: int = 1_000_000


#: Limits per kind of file. COCO train2017 annotations are 450 MiB with ~10 million values.
LIMITS: dict[str, Limits] = {
    "config": Limits(max_bytes=1 << 20, max_depth=16, max_nodes=100_000),
    "annotations": Limits(max_bytes=4 << 30, max_depth=16, max_nodes=200_000_000),
    "checkpoint": Limits(max_bytes=16 << 30),
    "image": Limits(max_bytes=512 << 20),
    # Files detr_peg writes and reads back (a study's plan, a cell's state, evaluation results).
    "record": Limits(max_bytes=256 << 20, max_depth=32, max_nodes=20_000_000),
    # A folder lock's description of its holder (four short fields).
    "lock": Limits(max_bytes=64 << 10, max_depth=4, max_nodes=1_000),
}

#: Longest side over shortest side of an image; beyond it resizing leaves a side of no pixels.
MAX_ASPECT_RATIO = 100.0


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def check_regular_file(path: str | os.PathLike, what: str, kind: str, error: Callable[[str], UserError]) -> int:
    """Check ``path`` is a readable regular file within ``kind``'s limit, before opening it (a FIFO would block).

    Returns its size; raises the ``error`` built from one sentence naming the path and what is wrong.
    """
    name = os.fspath(path)
    shown = name or "''"  # an empty name is shown as such
    try:
        info = os.stat(name)
    except OSError as exc:
        raise error(f"{what} {shown} {_stat_problem(name, exc)}.") from None
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise error(f"{what} {shown} is a folder, not a file.")
    if not stat.S_ISREG(mode):
        raise error(f"{what} {shown} is {_special_kind(mode)}, not a regular file.")
    limit = LIMITS[kind].max_bytes
    if info.st_size > limit:
        raise error(
            f"{what} {shown} is {_size(info.st_size)}, more than the {_size(limit)} accepted for a {kind} file."
        )
    if not os.access(name, os.R_OK):
        raise error(f"{what} {shown} cannot be read: Permission denied.")
    return info.st_size


def _stat_problem(name: str, exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        if os.path.islink(name):
            return f"is a symbolic link to {os.readlink(name)}, which does not exist"
        obstacle = path_obstacle(name)
        return f"does not exist ({obstacle})" if obstacle else "does not exist"
    if exc.errno == errno.ELOOP:
        return "is a symbolic link that refers to itself in a loop"
    if exc.errno == errno.ENAMETOOLONG:
        return "has a name longer than the file system allows"
    return f"cannot be read: {exc.strerror or exc}"


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def read_bounded_bytes(path: str | os.PathLike, what: str, kind: str, error: Callable[[str], UserError]) -> bytes:
    """The bytes of a file checked by :func:`check_regular_file`, reading at most ``limit + 1``; raises ``error``."""
    check_regular_file(path, what, kind, error)
    limit = LIMITS[kind].max_bytes
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{what} {name} cannot be read: {exc.strerror or exc}.") from None
    if len(data) > limit:
        raise error(f"{what} {name} is larger than the {_size(limit)} accepted for a {kind} file.")
    return data


def decode_utf8(
    data: bytes, path: str | os.PathLike, what: str, error: Callable[[str], UserError], advice: str = ""
) -> str:
    """``data`` as text, or an error naming the first byte that is not UTF-8 (then ``advice``, when given)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        end = f"; {advice}" if advice else "."
        raise error(f"{what} {os.fspath(path)} is not UTF-8 text ({exc.reason} at byte {exc.start}){end}") from None


def check_tree(data: Any, path: str | os.PathLike, what: str, kind: str, error: Callable[[str], UserError]) -> Any:
    """Return ``data`` unless too deep, too large with aliases expanded, or holding non-int64 ints (``error``)."""
    limits = LIMITS[kind]
    name = os.fspath(path)
    stack: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        if isinstance(value, ScalarText):
            value = value.value
        nodes += 1
        if nodes > limits.max_nodes:
            raise error(
                f"{what} {name} expands to more than {limits.max_nodes} values (nested YAML aliases or an "
                "oversized file); refusing to use it."
            )
        if depth > limits.max_depth:
            raise error(f"{what} {name} is nested more than {limits.max_depth} levels deep; refusing to use it.")
        if isinstance(value, dict):
            stack.extend((k, depth + 1) for k in value.keys())
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise error(
                f"{what} {name} holds the integer {shortened(str(value), 30)}, outside the signed 64-bit range."
            )
    return data


def parse_json(
    raw: bytes, path: str | os.PathLike, what: str, kind: str, error: Callable[[str], UserError], advice: str = ""
) -> Any:
    """``raw`` parsed as JSON and bounded; raises ``error``: not UTF-8, not JSON (line and column), or over a limit."""
    name = os.fspath(path)
    end = f"; {advice}" if advice else "."
    refuse = f"; {advice}" if advice else "; refusing to use it."
    text = decode_utf8(raw, path, what, error, advice)  # json.loads of bytes would also take UTF-16 and UTF-32
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} {name} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){end}"
        ) from None
    except RecursionError:
        raise error(f"{what} {name} is nested too deeply to parse{refuse}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"{what} {name} holds a value that cannot be read ({exc}){end}") from None
    return check_tree(data, path, what, kind, error)


@dataclass(frozen=True)
class ScalarText:
    """A plain YAML scalar that YAML reads as a non-string (``2001-12-14``, ``yes``), with its text as written."""

    value: Any
    text: str


def plain(value: Any) -> Any:
    """``value`` without its :class:`ScalarText` wrapper (lists too)."""
    if isinstance(value, ScalarText):
        return value.value
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.again = key, first, again


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader with bounded alias uses and unique keys at every depth (``<<`` merged keys may be overridden)."""

    max_aliases = 1000

    def __init__(self, text: str, keep_text: bool = False) -> None:
        super().__init__(text)
        self.keep_text = keep_text
        self.key_nodes: set[int] = set()

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            self.aliases_used = getattr(self, "aliases_used", 0) + 1
            if self.aliases_used > self.max_aliases:
                raise yaml.YAMLError(f"more than {self.max_aliases} YAML aliases")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                self.key_nodes.add(id(key_node))
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the safe loader refuses it below
                    continue
                if first is not None:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
                lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        value = super().construct_object(node, deep=deep)
        if (
            self.keep_text
            and isinstance(node, yaml.ScalarNode)
            and node.style is None
            and not isinstance(value, str)
            and id(node) not in self.key_nodes
        ):
            return ScalarText(value, node.value)
        return value


def load_yaml_text(
    text: str,
    path: str | os.PathLike,
    what: str,
    kind: str,
    error: Callable[[str], UserError],
    *,
    keep_text: bool = False,
) -> Any:
    """Parse YAML safely and bound it; with ``keep_text``, non-string plain scalars come back as :class:`ScalarText`.

    Raises yaml.YAMLError (invalid YAML), or ``error``: a key given twice in a mapping, too many aliases, over a limit.
    """
    loader = _BoundedLoader(text, keep_text)
    try:
        data = loader.get_single_data()
    except RecursionError:
        raise error(f"{what} {os.fspath(path)} is nested too deeply to parse; refusing to use it.") from None
    except _DuplicateKey as exc:
        raise error(
            f"{what} {os.fspath(path)} gives the key {exc.key!r} twice in one mapping (line {exc.first} and "
            f"line {exc.again}); YAML would keep only the last, so keep one."
        ) from None
    except yaml.YAMLError as exc:
        if str(exc).startswith("more than"):
            raise error(
                f"{what} {os.fspath(path)} uses {exc} (nested aliases can expand without bound); refusing to use it."
            ) from None
        raise
    finally:
        loader.dispose()
    return check_tree(data, path, what, kind, error)


def check_image_shape(width: int, height: int, path: str | os.PathLike, error: Callable[[str], UserError]) -> None:
    """Refuse an image with a side of no pixels or an aspect ratio above :data:`MAX_ASPECT_RATIO`."""
    if min(width, height) < 1 or max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise error(
            f"Image file {os.fspath(path)} is {width} x {height} pixels, an aspect ratio above "
            f"{MAX_ASPECT_RATIO:g}:1 that resizing cannot keep; crop or pad it."
        )
