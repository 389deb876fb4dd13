"""Bounded reading (rules 3 and 11 of docs/guarantees.md): files and their data checked against :data:`LIMITS`."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import yaml

from detr_peg.errors import UserError
from detr_peg.messages import shortened
from detr_peg.outputs import path_obstacle

StrPath = str | os.PathLike
ErrorType = Callable[[str], UserError]
REFUSING = "; refusing to use it."
MAX_ALIASES = 1000
MERGE_TAG = "tag:yaml.org,2002:merge"


class Limits(NamedTuple):
    """Bounds for one kind of file: bytes, and for parsed data nesting depth and values (aliases expanded)."""

    max_bytes: int
    max_depth: int = 64
    max_nodes: int = 1_000_000


LIMITS: dict[str, Limits] = {
    "config": Limits(max_bytes=1 << 20, max_depth=16, max_nodes=100_000),
    "annotations": Limits(max_bytes=4 << 30, max_depth=16, max_nodes=200_000_000),  # train2017: 450 MiB, 10M values
    "checkpoint": Limits(max_bytes=16 << 30),
    "image": Limits(max_bytes=512 << 20),
    "record": Limits(max_bytes=256 << 20, max_depth=32, max_nodes=20_000_000),  # plans, states, results we wrote
}
MAX_ASPECT_RATIO = 100.0  # longest side over shortest; beyond it resizing leaves a side of no pixels
_SPECIAL = {"p": "a FIFO (named pipe)", "s": "a socket", "c": "a device", "b": "a device"}  # by stat.filemode
_STAT_PROBLEMS = {
    errno.ELOOP: "is a symbolic link that refers to itself in a loop",
    errno.ENAMETOOLONG: "has a name longer than the file system allows",
}


def _refuser(error: ErrorType, what: str, path: StrPath, advice: str = "") -> Callable[..., UserError]:
    """``refuse(problem, ending=".")``: ``error`` of "``what`` ``path`` ``problem``", ended by ``advice`` if given."""
    name = os.fspath(path) or "''"  # an empty name is shown as such
    return lambda problem, ending=".": error(f"{what} {name} {problem}{f'; {advice}' if advice else ending}")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def check_regular_file(path: StrPath, what: str, kind: str, error: ErrorType) -> int:
    """The size of ``path``, checked to be a readable regular file within ``kind``'s limit before it is opened."""
    refuse, name = _refuser(error, what, path), os.fspath(path)
    try:
        info = os.stat(name)  # not open(): a FIFO would block
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise refuse(_STAT_PROBLEMS.get(exc.errno, f"cannot be read: {exc.strerror or exc}")) from None
        if os.path.islink(name):
            raise refuse(f"is a symbolic link to {os.readlink(name)}, which does not exist") from None
        obstacle = path_obstacle(name)
        raise refuse(f"does not exist ({obstacle})" if obstacle else "does not exist") from None
    if stat.S_ISDIR(info.st_mode):
        raise refuse("is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise refuse(f"is {_SPECIAL.get(stat.filemode(info.st_mode)[0], 'a special file')}, not a regular file")
    if info.st_size > (limit := LIMITS[kind].max_bytes):
        raise refuse(f"is {_size(info.st_size)}, more than the {_size(limit)} accepted for {kind} files")
    if not os.access(name, os.R_OK):
        raise refuse("cannot be read: Permission denied")
    return info.st_size


def read_bounded_bytes(path: StrPath, what: str, kind: str, error: ErrorType) -> bytes:
    """The bytes of a file checked by :func:`check_regular_file`, reading at most its limit + 1."""
    size = check_regular_file(path, what, kind, error)
    refuse, limit = _refuser(error, what, path), LIMITS[kind].max_bytes
    try:
        with open(path, "rb") as handle:
            data = handle.read(min(size, limit) + 1)  # read(n) reserves n bytes: not the limit for a small file
    except OSError as exc:
        raise refuse(f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > min(size, limit):
        raise refuse("says it is empty but holds data, as /proc and /sys files do; copy it to a regular file" if not size
                     else f"grew while it was read, or is larger than the {_size(limit)} accepted for {kind} files")  # fmt: skip
    return data


def decode_utf8(data: bytes, path: StrPath, what: str, error: ErrorType, advice: str = "") -> str:
    """``data`` as text without a leading byte order mark (Windows editors write one), or an error naming the first
    byte that is not UTF-8 (then ``advice``, when given)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _refuser(error, what, path, advice)(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_tree(data: Any, path: StrPath, what: str, kind: str, error: ErrorType) -> Any:
    """``data``, unless nested too deep, too large with aliases expanded, or holding an integer beyond int64."""
    refuse, limits = _refuser(error, what, path), LIMITS[kind]
    stack, nodes = [(data, 0)], 0
    while stack:
        value, depth = stack.pop()
        value = value.value if isinstance(value, ScalarText) else value
        nodes += 1
        if nodes > limits.max_nodes:
            problem = f"expands to more than {limits.max_nodes} values (nested YAML aliases or an oversized file)"
            raise refuse(problem, REFUSING)
        if depth > limits.max_depth:
            raise refuse(f"is nested more than {limits.max_depth} levels deep", REFUSING)
        if isinstance(value, (dict, list, tuple)):
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:  # True and False are in range
            shown = f"the integer {shortened(str(value), 30)}" if value.bit_length() < 9999 else "a larger integer"
            raise refuse(f"holds {shown}, outside the signed 64-bit range")
    return data


def parse_json(raw: bytes, path: StrPath, what: str, kind: str, error: ErrorType, advice: str = "") -> Any:
    """``raw`` parsed as JSON and bounded; refused when not UTF-8, not JSON (line and column) or over a limit."""
    refuse = _refuser(error, what, path, advice)
    text = decode_utf8(raw, path, what, error, advice)  # json.loads of bytes would also take UTF-16 and UTF-32
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise refuse(f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise refuse("is nested too deeply to parse", REFUSING) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise refuse(f"holds a value that cannot be read ({exc})") from None
    return check_tree(data, path, what, kind, error)


@dataclass(frozen=True)
class ScalarText:
    """A plain YAML scalar that YAML reads as a non-string (``2001-12-14``, ``yes``), with its text as written."""

    value: Any
    text: str

    def __repr__(self) -> str:  # messages show the value read, wherever it sits (``{'cuda': None}``)
        return repr(self.value)


def plain(value: Any) -> Any:
    """``value`` without its :class:`ScalarText` wrapper (lists too)."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.value if isinstance(value, ScalarText) else value


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader with at most :data:`MAX_ALIASES` alias uses and unique keys at every depth (``<<`` aside)."""

    def __init__(self, text: str, keep_text: bool, refuse: Callable[..., UserError]) -> None:
        super().__init__(text)
        self.keep_text, self.refuse, self.aliases_used = keep_text, refuse, 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        self.aliases_used += 1 if self.check_event(yaml.AliasEvent) else 0
        if self.aliases_used > MAX_ALIASES:
            problem = f"uses more than {MAX_ALIASES} YAML aliases (nested aliases can expand without bound)"
            raise self.refuse(problem, REFUSING)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        own = [k for k, _ in node.value if k.tag != MERGE_TAG] if isinstance(node, yaml.MappingNode) else []
        mapping = super().construct_mapping(node, deep=deep)  # merges "<<" into node.value, refuses unhashable keys
        first_nodes: dict[Any, yaml.Node] = {}
        for key_node in own:
            key = plain(self.construct_object(key_node))
            if (first := first_nodes.setdefault(key, key_node)) is not key_node:
                lines = f"line {first.start_mark.line + 1} and line {key_node.start_mark.line + 1}"
                problem = f"gives the key {key!r} twice in one mapping ({lines})"
                raise self.refuse(problem, "; YAML would keep only the last, so keep one.")
        return {plain(key): value for key, value in mapping.items()} if self.keep_text else mapping  # plain keys

    def construct_object(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        try:
            value = super().construct_object(node, deep=deep)
        except ValueError:  # Python reads no decimal integer of more than 4,300 digits
            raise self.refuse(f"holds a number of {len(node.value):,} digits", REFUSING) from None
        plain_scalar = isinstance(node, yaml.ScalarNode) and node.style is None and not isinstance(value, str)
        return ScalarText(value, node.value) if self.keep_text and plain_scalar else value


def load_yaml_text(text: str, path: StrPath, what: str, kind: str, error: ErrorType, *, keep_text: bool = False) -> Any:
    """YAML parsed safely and bounded (``keep_text``: see :class:`ScalarText`); invalid YAML raises yaml.YAMLError."""
    refuse = _refuser(error, what, path)
    try:
        data = yaml.load(text, Loader=lambda stream: _BoundedLoader(stream, keep_text, refuse))
    except RecursionError:
        raise refuse("is nested too deeply to parse", REFUSING) from None
    return check_tree(data, path, what, kind, error)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """`` at line N, column M (problem)`` of a YAML error, for the message that names the file (a Python tag's too)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return where + (f" ({problem})" if problem else "")


def check_image_shape(width: int, height: int, what: str, error: ErrorType) -> None:
    """Refuse an image (``what`` names it) with a side of no pixels or an aspect ratio above :data:`MAX_ASPECT_RATIO`."""
    if min(width, height) < 1 or max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise error(f"{what} is {width} x {height} pixels, an aspect ratio above {MAX_ASPECT_RATIO:g}:1 that resizing "
                    "cannot keep; crop or pad it.")  # fmt: skip
