"""Operating-system errors as one sentence: which path, what went wrong, what to do (Rule 5 of docs/guarantees.md)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from detr_peg.errors import OutputError
from detr_peg.messages import shortened

#: What to do, by ``errno``; the system's own wording comes first.
_ADVICE = {
    errno.EACCES: "choose a folder you can write to",
    errno.EPERM: "choose a folder you can write to",
    errno.EROFS: "the file system is read-only: choose a folder on a writable disk",
    errno.ENOSPC: "free some space or choose a folder on another disk",
    errno.EDQUOT: "free some space within your quota or choose a folder on another disk",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "a folder is in the way of the file: choose another name",
    errno.EEXIST: "something is in the way: choose another path",
    errno.ENOENT: "a folder on the way does not exist and cannot be created there: choose another path",
    errno.ELOOP: "the path has a loop of symbolic links: choose another path",
}


#: Refusals whose cause may be a part of the path rather than the name itself (see :func:`path_obstacle`).
_PATH_ERRNOS = {errno.ENOTDIR, errno.ENOENT, errno.EEXIST}


def path_obstacle(path: str | os.PathLike) -> str | None:
    """What stands in the way of writing ``path``: its first part that is a dangling link or a file; else None."""
    path = Path(os.fsdecode(path))
    parts = [*reversed(path.parents), path]
    for index, part in enumerate(parts):
        try:
            if part.is_symlink() and not part.exists():
                return f"{_shown(part)} is a symbolic link to {_shown(os.readlink(part))}, which does not exist"
            if index < len(parts) - 1 and part.exists() and not part.is_dir():
                return f"{_shown(part)} is a file, not a folder"
        except OSError:
            return None
    return None


def os_error_reason(exc: OSError, path: str | os.PathLike | None = None) -> str:
    """The system's reason then what to do (``File name too long; choose a shorter name``), naming a part at fault."""
    path = path if path is not None else exc.filename
    if exc.errno in _PATH_ERRNOS and isinstance(path, (str, bytes, os.PathLike)):
        obstacle = path_obstacle(path)
        if obstacle is not None:
            return f"{obstacle}; choose another path"
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    advice = _ADVICE.get(exc.errno or 0)
    return f"{reason}; {advice}" if advice else reason


def _shown(path: object) -> str:
    """A path for a message: whole when short, else its start and end around an ellipsis."""
    return shortened(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path), 120)


def write_error(path: str | os.PathLike, exc: OSError, verb: str = "write") -> OutputError:
    """``Could not <verb> PATH: <reason>; <what to do>.`` as an :class:`OutputError`."""
    return OutputError(f"Could not {verb} {_shown(path)}: {os_error_reason(exc, path)}.")


def describe_os_error(exc: OSError) -> str:
    """One sentence for an ``OSError`` that reached the command line (its file, the reason, what to do)."""
    if exc.filename is None:
        return f"{os_error_reason(exc)}."
    target = _shown(exc.filename)
    if exc.filename2 is not None:
        target = f"{target} -> {_shown(exc.filename2)}"
    return f"Could not access {target}: {os_error_reason(exc)}."


@contextlib.contextmanager
def writing(path: str | os.PathLike, verb: str = "write") -> Iterator[None]:
    """Run the block; an ``OSError`` in it becomes :func:`write_error` naming ``path`` (or the file it names)."""
    try:
        yield
    except OSError as exc:
        raise write_error(exc.filename if exc.filename is not None else path, exc, verb) from None


def make_folder(path: str | os.PathLike) -> None:
    """``mkdir -p path``, or one :class:`OutputError` sentence saying why it cannot be made."""
    with writing(path, "create the folder"):
        os.makedirs(path, exist_ok=True)
