"""Outputs never overlap inputs, and a command only replaces files that detr_peg wrote (Rule 1 of docs/guarantees.md).

Ownership is recorded per output folder in ``.detr-peg-outputs.json`` (name -> kind of command); a folder
without it holds only the user's files unless :attr:`Output.adopt` says it is the command's own.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from detr_peg.errors import OutputError, UserError
from detr_peg.fileio.atomic import atomic_write
from detr_peg.fileio.os_errors import write_error
from detr_peg.guards.folder_lock import FolderLock

#: The file, inside a folder, listing the names detr_peg wrote there.
OWNERSHIP_FILE = ".detr-peg-outputs.json"

#: Kinds of command whose files another kind may replace, besides its own.
MAY_REPLACE: dict[str, tuple[str, ...]] = {"eval": ("train",)}


@dataclass(frozen=True)
class Input:
    """Something a command reads; ``option`` is how the user named it (``--checkpoint``, ``SRC``)."""

    path: Path
    option: str


@dataclass(frozen=True)
class Output:
    """Something a command writes: a file, or a folder and the ``names`` written into it.

    ``kind``: who owns it (default: the command); ``adopt``: unlisted existing names count as owned (``--resume``).
    """

    path: Path
    option: str
    names: tuple[str, ...] = ()
    kind: str | None = None
    adopt: bool = False

    @property
    def is_folder(self) -> bool:
        return bool(self.names)

    def targets(self) -> list[Path]:
        """Every path the command writes."""
        return [self.path / name for name in self.names] if self.is_folder else [self.path]


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file or folder (symbolic and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(child: Path, parent: Path) -> bool:
    """Whether ``child`` is ``parent`` or lies below it, after resolving links."""
    return Path(os.path.realpath(child)).is_relative_to(os.path.realpath(parent))


def _refuse(command: str, message: str) -> UserError:
    return UserError(f"{message}; {command} never writes over its inputs: choose another output.")


def check_no_overlap(command: str, inputs: Sequence[Input], outputs: Sequence[Output]) -> None:
    """Refuse outputs that are, alias or lie inside an input; raises UserError naming both options and paths."""
    for output in outputs:
        for item in inputs:
            if output.is_folder and os.path.isdir(item.path) and _inside(output.path, item.path):
                where = "is" if _same(output.path, item.path) else "is inside"
                raise _refuse(
                    command, f"{output.option} {output.path} {where} {item.option} {item.path}, a folder it reads"
                )
            for target in output.targets():
                if _same(target, item.path):
                    shown = target if target == output.path else f"{output.path} (its {target.name})"
                    raise _refuse(command, f"{output.option} {shown} is the same file as {item.option} {item.path}")
                if os.path.isdir(item.path) and _inside(target, item.path):
                    raise _refuse(
                        command, f"{output.option} {target} is inside {item.option} {item.path}, a folder it reads"
                    )


def _owned(folder: Path) -> dict[str, str]:
    """Name -> kind of command, from the folder's ownership file (empty when it has none)."""
    try:
        data = json.loads((folder / OWNERSHIP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, dict):
        return {}
    return {n: k for n, k in names.items() if isinstance(n, str) and isinstance(k, str)}


def _owned_by(output: Output, folder: Path, names: tuple[str, ...], kind: str) -> dict[str, str]:
    """:func:`_owned`, plus the existing names an adopting output claims (see :attr:`Output.adopt`)."""
    owned = _owned(folder)
    if output.adopt:
        # Names the ownership file does not list (all of them in a folder written before it existed) are adopted.
        owned.update({name: kind for name in names if name not in owned and os.path.lexists(folder / name)})
    return owned


def _split(output: Output, command: str) -> tuple[Path, tuple[str, ...], str]:
    folder, names = (output.path, output.names) if output.is_folder else (output.path.parent, (output.path.name,))
    return folder, names, output.kind or command


def check_ownership(command: str, outputs: Sequence[Output]) -> None:
    """Refuse to replace a file the same kind of command (or :data:`MAY_REPLACE`) did not write; raises UserError."""
    for output in outputs:
        folder, names, kind = _split(output, command)
        if output.is_folder and os.path.exists(output.path) and not os.path.isdir(output.path):
            raise UserError(f"{output.option} {output.path} is a file, not a folder; choose a folder.")
        if not output.is_folder and os.path.isdir(output.path):
            raise UserError(f"{output.option} {output.path} is a folder; give a file name.")
        if not os.path.isdir(folder):
            continue
        owned = _owned_by(output, folder, names, kind)
        allowed = (kind, *MAY_REPLACE.get(kind, ()))
        for name in names:
            if os.path.lexists(folder / name) and owned.get(name) not in allowed:
                origin = (
                    f"was written by detr-peg {owned[name]}, not {kind}"
                    if name in owned
                    else "was not written by detr-peg"
                )
                raise UserError(
                    f"{folder / name} exists and {origin}; {command} replaces only files it wrote itself: move it "
                    f"or choose another {output.option}."
                )


@dataclass
class _Claim:
    """Names added to a folder's ownership file by this process, and what the file held before."""

    folder: Path
    previous: bytes | None
    added: set[str]
    created_folder: bool


def record_ownership(command: str, outputs: Sequence[Output]) -> list[_Claim]:
    """Add the names of ``outputs`` to their folders' ownership files before anything is written, so a killed run still
    owns what it wrote. A folder that cannot be created or written is skipped (the command's own check reports it).
    """
    claims: list[_Claim] = []
    for output in outputs:
        folder, names, kind = _split(output, command)
        owned = _owned(folder)
        added = {name: kind for name in names if name not in owned}
        if not added:
            continue
        created = not os.path.exists(folder)
        ledger = folder / OWNERSHIP_FILE
        try:
            folder.mkdir(parents=True, exist_ok=True)
            previous = ledger.read_bytes() if os.path.isfile(ledger) else None
            _write_ledger(folder, {**owned, **added})
        except OSError:
            # A folder that cannot be created or written: the command's own check says so in its words,
            # and nothing will be written there to own.
            if created and os.path.isdir(folder) and not any(folder.iterdir()):
                folder.rmdir()
            continue
        claims.append(_Claim(folder, previous, set(added), created))
    return claims


def _write_ledger(folder: Path, names: dict[str, str]) -> None:
    content = json.dumps({"written_by": "detr-peg", "names": dict(sorted(names.items()))}, indent=1) + "\n"
    _write_bytes(folder / OWNERSHIP_FILE, content.encode("utf-8"))


def _write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data), error=None)


class OutputClaims:
    """The names a command claimed and its folder locks; leaving the ``with`` block settles them.

    Names not written are taken back, so a failed command leaves its folders as they were.
    """

    def __init__(self, claims: list[_Claim], locks: list[FolderLock] | None = None) -> None:
        self._claims = claims
        self._locks = list(locks or [])

    def __enter__(self) -> OutputClaims:
        return self

    def add(self, claims: list[_Claim]) -> None:
        """Hold ``claims`` too (settled with the rest)."""
        self._claims.extend(claims)

    def __exit__(self, *exc: object) -> None:
        self.settle()

    def settle(self) -> None:
        """Take back the names not written and release the locks, deepest folder first (idempotent)."""

        def depth(folder: Path) -> int:
            return -len(Path(os.path.abspath(folder)).parts)

        locks = {os.path.abspath(lock.folder): lock for lock in self._locks}
        self._locks.clear()
        claims, self._claims = sorted(self._claims, key=lambda claim: depth(claim.folder)), []
        for claim in claims:
            _settle(claim)
            lock = locks.pop(os.path.abspath(claim.folder), None)
            if lock is not None:
                lock.release()
        for lock in sorted(locks.values(), key=lambda lock: depth(lock.folder)):
            lock.release()


def _settle(claim: _Claim) -> None:
    unused = {name for name in claim.added if not os.path.lexists(claim.folder / name)}
    if not unused:
        return
    try:
        if unused == claim.added:
            ledger = claim.folder / OWNERSHIP_FILE
            if claim.previous is not None:
                _write_bytes(ledger, claim.previous)
            else:
                ledger.unlink(missing_ok=True)
                if claim.created_folder and not any(claim.folder.iterdir()):
                    claim.folder.rmdir()
        else:
            _write_ledger(claim.folder, {n: k for n, k in _owned(claim.folder).items() if n not in unused})
    except OSError:
        pass  # the ledger keeps a name it does not need: harmless


def guard_outputs(command: str, inputs: Sequence[Input], outputs: Sequence[Output]) -> OutputClaims:
    """Check, lock and claim ``outputs`` for ``command``; call once before writing and write inside the returned block.

    Raises UserError (FolderInUse: a locked folder) naming the options at fault, or OutputError: an unwritable output.
    """
    inputs = [Input(Path(i.path), i.option) for i in inputs if i.path is not None and str(i.path) != ""]
    outputs = [Output(Path(o.path), o.option, tuple(o.names), o.kind, o.adopt) for o in outputs]
    check_no_overlap(command, inputs, outputs)
    # Ownership is checked before the locks create any missing folder (a folder created for its lock is not
    # a file of the user's); a second command of the same kind passes it and then stops at the lock.
    check_ownership(command, outputs)
    claims = OutputClaims([], lock_folders(command, outputs))
    try:
        check_writable(command, outputs)
        claims.add(record_ownership(command, outputs))
    except BaseException:
        claims.settle()
        raise
    return claims


def check_writable(command: str, outputs: Sequence[Output]) -> None:
    """Refuse an output the atomic writer could not write, by probing ``.NAME.tmp-PID`` as it would, before any work.

    Raises OutputError naming the option, the path, the reason and what to do.
    """
    for output in outputs:
        folder, names, _ = _split(output, command)
        for name in names:
            target = folder / name
            if not output.is_folder and target.is_dir():
                raise OutputError(
                    f"Could not write {output.option} {target}: it is a folder; choose a file name for {output.option}."
                )
            probe = folder / f".{name}.tmp-{os.getpid()}"
            if os.path.lexists(probe):
                continue  # this process is writing it already
            try:
                os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise write_error(target, exc, f"write {output.option}") from None
            finally:
                # Also when a stop signal's exception lands between the two calls: no probe is left behind.
                with contextlib.suppress(OSError):
                    probe.unlink()


def lock_folders(command: str, outputs: Sequence[Output]) -> list[FolderLock]:
    """Lock every folder ``outputs`` write into; raises FolderInUse (releasing those taken) when one is held."""
    locks: list[FolderLock] = []
    seen: set[str] = set()
    try:
        for output in outputs:
            folder = _split(output, command)[0]
            key = os.path.abspath(folder)
            if key not in seen:
                seen.add(key)
                lock = FolderLock(folder, command, output.option)
                lock.acquire()
                locks.append(lock)
    except BaseException:
        for lock in reversed(locks):
            lock.release()
        raise
    return locks
