"""Output safety (docs/guarantees.md), in this order: operating-system errors as one sentence; atomic writes;
one command per output folder (a ``filelock`` on ``.detr-peg.lock``); outputs that never overlap inputs and never
replace a file that another kind of command or the user wrote.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock, Timeout

from detr_peg.errors import OutputError, UserError
from detr_peg.messages import shortened

#: In each output folder: the lock, its holder's description (for messages), and the names detr-peg wrote there.
LOCK_FILE, HOLDER_FILE, OWNERSHIP_FILE = ".detr-peg.lock", ".detr-peg.lock.json", ".detr-peg-outputs.json"
#: The largest ownership record read (a predict of a million pictures writes about 40 MB).
RECORD_LIMIT = 1 << 28
#: Kinds of command whose files another kind may replace, besides its own.
MAY_REPLACE = {"eval": ("train",)}

_SPACE = "or choose a folder on another disk"
_ADVICE = {
    **dict.fromkeys((errno.EACCES, errno.EPERM), "choose a folder you can write to"),
    errno.EROFS: "the file system is read-only: choose a folder on a writable disk",
    errno.ENOSPC: f"free some space {_SPACE}",
    errno.EDQUOT: f"free some space within your quota {_SPACE}",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "a folder is in the way of the file: choose another name",
    errno.EEXIST: "something is in the way: choose another path",
    errno.ENOENT: "a folder on the way does not exist and cannot be created there: choose another path",
    errno.ELOOP: "the path has a loop of symbolic links: choose another path",
    **dict.fromkeys(
        (errno.EMFILE, errno.ENFILE), "raise the limit of open files (ulimit -n) or lower data.num_workers"
    ),  # fmt: skip
}


def _shown(path: object) -> str:
    return shortened(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path), 120)


def unexpanded_home(path: str | os.PathLike) -> str | None:
    """For a path that starts with a ``~`` nothing expanded (``--output=~/x``, a config value), what to write."""
    text, home = os.fsdecode(path), os.path.expanduser(os.fsdecode(path))
    note = "detr-peg does not expand '~' (a shell does, at the start of a word); write "
    return note + _shown(home) if home != text else None


def path_obstacle(path: str | os.PathLike) -> str | None:
    """What stands in the way of ``path``: an unexpanded ``~``, a dangling link or a file on the way; else None."""
    text = os.fsdecode(path)
    parts = [*reversed(Path(text).parents), Path(text)]
    if unexpanded_home(text) and not Path(Path(text).parts[0]).exists():
        return unexpanded_home(text)
    for index, part in enumerate(parts):
        try:
            if part.is_symlink() and not part.exists():
                return f"{_shown(part)} is a symbolic link to {_shown(os.readlink(part))}, which does not exist"
            if index < len(parts) - 1 and part.exists() and not part.is_dir():
                return f"{_shown(part)} is a file, not a folder"
        except OSError:
            return None
    return None


def os_reason(exc: OSError, path: object = None) -> str:
    """Why ``exc`` happened, and what to do, as the end of a sentence (no final full stop)."""
    path = path if path is not None else exc.filename
    if exc.errno in (errno.ENOTDIR, errno.ENOENT, errno.EEXIST) and isinstance(path, (str, bytes, os.PathLike)):
        obstacle = path_obstacle(path)
        if obstacle is not None:
            return f"{obstacle}; choose another path"
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return f"{reason}; {_ADVICE[exc.errno]}" if exc.errno in _ADVICE else reason


def write_error(path: str | os.PathLike, exc: OSError, verb: str = "write") -> OutputError:
    """``Could not <verb> PATH: <reason>; <what to do>.`` as an :class:`OutputError`."""
    return OutputError(f"Could not {verb} {_shown(path)}: {os_reason(exc, path)}.")


def describe_os_error(exc: OSError) -> str:
    """One sentence for an ``OSError`` that reached the command line (its files, the reason, what to do)."""
    if exc.filename is None:
        return f"{os_reason(exc)}."
    target = _shown(exc.filename) + (f" -> {_shown(exc.filename2)}" if exc.filename2 is not None else "")
    return f"Could not access {target}: {os_reason(exc)}."


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


class ErrorRecorder:
    """A file whose ``write``/``flush`` keep the OSErrors they raise (torch.save reports them as RuntimeError)."""

    def __init__(self, handle: BinaryIO, errors: list[OSError]) -> None:
        self._handle, self._errors = handle, errors

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handle, name)
        if name not in ("write", "flush"):
            return attr

        def recorded(*args: Any) -> Any:
            try:
                return attr(*args)
            except OSError as exc:
                self._errors.append(exc)
                raise

        return recorded


def atomic_write(
    path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, error: type[UserError] = OutputError
) -> Path:
    """Write ``path`` atomically with ``write(handle)``, removing temporaries of killed writers; raises ``error``
    with the :func:`write_error` sentence, the previous file untouched."""
    path = Path(path)
    tmp, errors = path.with_name(f".{path.name}.tmp-{os.getpid()}"), []
    try:
        with open(tmp, "wb") as handle:
            try:
                write(ErrorRecorder(handle, errors))
            except RuntimeError:
                if errors:
                    raise errors[0] from None
                raise
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise error(str(write_error(path, exc))) from None
        raise
    with contextlib.suppress(OSError):  # make the rename durable; not every platform can open a folder
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    remove_stale(path.parent, f".{path.name}.tmp-")
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, error: type[UserError] = OutputError) -> Path:
    """Write ``text`` as UTF-8 atomically (see :func:`atomic_write`)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda handle: handle.write(data), error=error)


def write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON atomically (``indent=None``: compactly); raises OutputError."""
    separators = None if indent is not None else (",", ":")
    return atomic_write_text(path, json.dumps(data, indent=indent, separators=separators) + "\n")


def save_figure(path: str | os.PathLike, figure: Any, **options: Any) -> Path:
    """Save a Matplotlib figure atomically in the format its suffix names; a PDF gets no date, so redraws match."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt == "pdf":
        options.setdefault("metadata", {"CreationDate": None})
    return atomic_write(path, lambda handle: figure.savefig(handle, format=fmt, **options))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (one of another user counts)."""
    if not 0 < pid < 2**31:  # no process has such a number (0 and -1 would name groups)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's
        pass
    return True


def remove_stale(folder: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove the files and folders ``folder/PREFIX<pid>`` of processes that no longer exist; return them."""
    removed: list[Path] = []
    if os.name != "posix":  # os.kill(pid, 0) probes a process only on POSIX
        return removed
    with contextlib.suppress(OSError):
        for leftover in Path(folder).glob(f"{glob.escape(prefix)}*"):
            pid = leftover.name[len(prefix) :]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)
                removed.append(leftover)
    return removed


class FolderInUse(UserError):
    """Another process holds the folder's lock."""


def _state_file(path: Path, limit: int) -> Any:
    """The JSON of one of detr-peg's own files in an output folder; None unless it is a regular file (not a link, a
    FIFO or a folder, which are never followed) of at most ``limit`` bytes holding JSON."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb") as handle:
            info = os.fstat(handle.fileno())  # read(n) reserves n bytes: a run out of memory could not settle
            data = handle.read(min(info.st_size, limit) + 1) if stat.S_ISREG(info.st_mode) else b""
        return json.loads(data) if 0 < len(data) <= limit else None
    except (OSError, ValueError, RecursionError):
        return None


def _holder(folder: Path) -> dict | None:
    """The holder described in ``folder``; None when absent or damaged (it serves messages only)."""
    h = _state_file(Path(folder) / HOLDER_FILE, 1 << 16)
    fields = {"pid": int, "host": str, "command": str, "since": str}  # shown in messages: printable, one line
    sound = isinstance(h, dict) and all(type(h.get(k)) is t and str(h[k]).isprintable() for k, t in fields.items())
    return h if sound and 0 < h["pid"] < 2**31 else None


def holder_alive(folder: Path, command: str | None = None) -> bool | None:
    """Whether the holder described in ``folder`` still runs (the lock is not tried): None for no holder or another
    ``command``'s; False for a gone process of this machine; True when running, or elsewhere."""
    holder = _holder(folder)
    if holder is None or command not in (None, holder["command"]):
        return None
    return holder["host"] != socket.gethostname() or process_alive(holder["pid"])


@contextlib.contextmanager
def folder_lock(folder: Path, command: str, option: str) -> Iterator[None]:
    """Hold the exclusive lock of ``folder`` (created with its parents when missing, and those removed on release if
    left empty), re-entrant in one process; raises FolderInUse naming the holder, or OutputError when unwritable."""
    folder = Path(folder)
    try:
        created = [made for made in (folder, *folder.parents) if not made.exists()]  # innermost first
        folder.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(folder / LOCK_FILE) and not stat.S_ISREG(os.lstat(folder / LOCK_FILE).st_mode):
            raise OutputError(f"{folder / LOCK_FILE} is not a regular file (a link, a FIFO or a folder), so detr-peg "
                              "cannot lock the folder there without touching what it points at: remove it.")  # fmt: skip
        new_file = not (folder / LOCK_FILE).exists()
        lock = FileLock(str(folder / LOCK_FILE), timeout=0, is_singleton=True)
        lock.acquire()
    except Timeout:
        holder, who = _holder(folder), "another detr-peg command"
        if holder is not None:
            who = f"detr-peg {holder['command']} (process {holder['pid']} on {holder['host']}, since {holder['since']})"
        raise FolderInUse(
            f"{option} {folder} is in use by {who}; wait for it to end, or stop it, or choose another {option}."
        ) from None
    except OSError as exc:
        if isinstance(exc, FileExistsError):  # mkdir met a file where a folder of the path should be
            exc = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        raise write_error(folder, exc, f"write into {option}") from None
    first = lock.lock_counter == 1  # the first holder in this process describes itself, and cleans up
    if first:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
        with contextlib.suppress(OSError):
            text = json.dumps({**holder, "since": time.strftime("%Y-%m-%d %H:%M:%S")})
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK  # never through a link
            with open(os.open(folder / HOLDER_FILE, flags, 0o644), "w") as handle:
                handle.write(text + "\n")
    try:
        yield
    finally:
        if first:
            with contextlib.suppress(OSError):
                (folder / HOLDER_FILE).unlink(missing_ok=True)
                if new_file:
                    (folder / LOCK_FILE).unlink(missing_ok=True)  # while held: no one can lock a gone file
        lock.release()
        with contextlib.suppress(OSError):
            for made in created if first else ():
                made.rmdir()  # only when empty: nothing was written there


@dataclass(frozen=True)
class Input:
    """Something a command reads; ``option`` is how the user named it (``--checkpoint``, ``SRC``)."""

    path: Path
    option: str


@dataclass(frozen=True)
class Output:
    """A file, or a folder and the ``names`` written into it; ``kind`` owns them (default: the command); with
    ``adopt``, existing names the ownership file lacks count as owned (``--resume`` of an older run)."""

    path: str | os.PathLike  # as given: an empty name is refused, not read as the current folder
    option: str
    names: tuple[str, ...] = ()
    kind: str | None = None
    adopt: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"{self.option} must be a path (str or os.PathLike), got {self.path!r}.")

    @property
    def folder(self) -> Path:
        return Path(self.path) if self.names else Path(self.path).parent

    def targets(self) -> list[Path]:
        return [Path(self.path) / name for name in self.names] if self.names else [Path(self.path)]


def inputs(*pairs: tuple[object, str]) -> list[Input]:
    """The local files and folders among ``(path, option)`` pairs (None, URLs and ``torchvision://`` left out)."""
    remote = ("http://", "https://", "torchvision://", "timm://")
    return [Input(Path(str(path)), option) for path, option in pairs if path and not str(path).startswith(remote)]


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(child: Path, parent: Path) -> bool:
    return Path(os.path.realpath(child)).is_relative_to(os.path.realpath(parent))


def check_no_overlap(command: str, inputs: Sequence[Input], outputs: Sequence[Output]) -> None:
    """Refuse outputs that are, alias or lie inside an input; raises UserError naming both options and paths."""
    for output in outputs:
        for item in inputs:
            problem, reads_folder = None, os.path.isdir(item.path)
            if output.names and reads_folder and _inside(output.path, item.path):
                where = "is" if _same(output.path, item.path) else "is inside"
                problem = f"{output.option} {output.path} {where} {item.option} {item.path}, a folder it reads"
            for target in output.targets():
                if problem is None and _same(target, item.path):
                    shown = target if target == output.path else f"{output.path} (its {target.name})"
                    problem = f"{output.option} {shown} is the same file as {item.option} {item.path}"
                elif problem is None and reads_folder and _inside(target, item.path):
                    problem = f"{output.option} {target} is inside {item.option} {item.path}, a folder it reads"
            if problem:
                raise UserError(f"{problem}; {command} never writes over its inputs: choose another output.")


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in ("/", os.sep, "\0"))


def _ledger(folder: Path) -> tuple[dict[str, str], dict[str, int]]:
    """The ownership file's names (name -> kind of command) and pending claims (name -> process); empty when
    it is missing or damaged. Only plain names of files in ``folder`` count (never ``../x`` or a path)."""
    ledger = _state_file(folder / OWNERSHIP_FILE, RECORD_LIMIT)
    names = ledger.get("names") if isinstance(ledger, dict) else None
    pending = ledger.get("pending", {}) if isinstance(ledger, dict) else None
    if not isinstance(names, dict) or not isinstance(pending, dict):
        return {}, {}
    return (
        {n: k for n, k in names.items() if _plain_name(n) and isinstance(k, str)},
        {n: p if type(p) is int else 0 for n, p in pending.items() if _plain_name(n)},  # 0: no process
    )


def _damaged(record: Path) -> bool:
    data = _state_file(record, RECORD_LIMIT) if os.path.lexists(record) else {"names": {}}
    return not (isinstance(data, dict) and isinstance(data.get("names"), dict))


def owned_names(folder: Path) -> dict[str, str]:
    """Name -> kind of command that wrote it. A name claimed by a process that ended before settling its claims
    (killed, or unable to rewrite this file) is nobody's: a file there may be the user's."""
    names, pending = _ledger(folder)
    return {n: k for n, k in names.items() if n not in pending or process_alive(pending[n])}


def check_ownership(command: str, outputs: Sequence[Output]) -> None:
    """Refuse to replace a file that the same kind of command (or :data:`MAY_REPLACE`) did not write."""
    for output in outputs:
        if os.path.exists(output.path) and os.path.isdir(output.path) != bool(output.names):
            problem = "is a file, not a folder; choose a folder" if output.names else "is a folder; give a file name"
            raise UserError(f"{output.option} {output.path} {problem}.")
        kind, owned = output.kind or command, owned_names(output.folder)
        for target in output.targets():
            by = owned.get(target.name, kind if output.adopt else None)
            if os.path.lexists(target) and by not in (kind, *MAY_REPLACE.get(kind, ())):
                origin = f"was written by detr-peg {by}, not {kind}" if by else "was not written by detr-peg"
                if not by and _damaged(output.folder / OWNERSHIP_FILE):
                    origin += f" (the record of detr-peg's files there, {OWNERSHIP_FILE}, is damaged)"
                raise UserError(
                    f"{target} exists and {origin}; {command} replaces only files it wrote itself: move it "
                    f"or choose another {output.option}."
                )


def _check_writable(outputs: Sequence[Output]) -> None:
    """Refuse an output the atomic writer could not write, by creating ``.NAME.tmp-PID`` as it would (OutputError)."""
    for output in outputs:
        for target in output.targets():
            probe = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            if os.path.lexists(probe):
                continue  # this process is writing it already
            try:
                os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise write_error(target, exc, f"write {output.option}") from None
            finally:
                with contextlib.suppress(OSError):  # also when a stop signal lands between the two calls
                    probe.unlink()


def _write_ledger(folder: Path, names: dict[str, str], pending: dict[str, int]) -> None:
    content = {"written_by": "detr-peg", "names": dict(sorted(names.items()))}
    atomic_write_text(folder / OWNERSHIP_FILE, json.dumps({**content, **({"pending": pending} if pending else {})},
                                                          indent=1) + "\n")  # fmt: skip


def _take_back(folder: Path, claimed: set[str]) -> None:
    """Settle ``claimed`` in ``folder``'s ownership file: the names written are kept, the others dropped."""
    names, pending = _ledger(folder)
    kept = {name: kind for name, kind in names.items() if name not in claimed or os.path.lexists(folder / name)}
    left = {name: pid for name, pid in pending.items() if name not in claimed}
    with contextlib.suppress(OSError, UserError):  # unsettled, the claims are void once this process ends
        if kept and (kept, left) != (names, pending):
            _write_ledger(folder, kept, left)
        elif names and not kept:
            (folder / OWNERSHIP_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def all_or_nothing(paths: Sequence[Path]) -> Iterator[None]:
    """``paths`` as they were when the block raises: earlier contents written back, new files removed."""
    before = {path: path.read_bytes() if path.is_file() else None for path in paths}
    try:
        yield
    except BaseException:
        for path, data in before.items():
            with contextlib.suppress(OSError, UserError):  # the error being raised is the one to report
                path.unlink(missing_ok=True) if data is None else atomic_write(path, lambda f, d=data: f.write(d))
        raise


def guard_outputs(command: str, inputs: Sequence[Input], outputs: Sequence[Output]) -> contextlib.ExitStack:
    """Check, lock and claim ``outputs`` before ``command`` writes inside the returned block, whose end takes back
    the names not written and releases the locks; raises UserError (FolderInUse) naming the options, or OutputError."""
    inputs = [Input(Path(i.path), i.option) for i in inputs if i.path is not None and str(i.path) != ""]
    for empty in (o for o in outputs if not str(o.path).strip()):
        raise UserError(f"{empty.option} is empty ({str(empty.path)!r}); give a file or folder name.")
    for folder in (o for o in outputs if not o.names and str(o.path).endswith(("/", os.sep))):
        raise UserError(f"{folder.option} {folder.path} ends in a slash, which names a folder, but {command} writes "
                        "one file: give the file's name.")  # fmt: skip
    for tilde in (o for o in outputs if unexpanded_home(o.path)):
        raise UserError(f"{tilde.option} {tilde.path}: {unexpanded_home(tilde.path)} (or ./{tilde.path} for a folder "
                        "named '~').")  # fmt: skip
    outputs = [Output(Path(o.path), o.option, tuple(o.names), o.kind, o.adopt) for o in outputs]
    check_no_overlap(command, inputs, outputs)
    # Before the locks create missing folders (a folder made for a lock holds no file of the user's); a second
    # command of the same kind passes it and then stops at the lock.
    check_ownership(command, outputs)
    folders: dict[str, list[Output]] = {}
    for output in outputs:
        folders.setdefault(os.path.abspath(output.folder), []).append(output)
    with contextlib.ExitStack() as claims:  # left in reverse: each folder's names taken back, then its lock released
        for key in sorted(folders, key=lambda folder: len(Path(folder).parts)):  # outer folders first
            first = folders[key][0]
            claims.enter_context(folder_lock(first.folder, command, first.option))
            _check_writable(folders[key])
            for output in folders[key]:  # claimed, pending until settled, before anything is written
                kind, owned = output.kind or command, owned_names(output.folder)
                added = {target.name: kind for target in output.targets() if target.name not in owned}
                if added:
                    pending = {n: p for n, p in _ledger(output.folder)[1].items() if n in owned}
                    _write_ledger(output.folder, {**owned, **added}, {**pending, **dict.fromkeys(added, os.getpid())})
                present = {target.name for target in output.targets() if os.path.lexists(target)}
                claims.callback(_take_back, output.folder, set(added) | present)  # unwritten, or removed by it
        return claims.pop_all()
