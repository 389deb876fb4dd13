"""One command per output folder: an exclusive lock on every folder a command writes into.

:func:`~detr_peg.guards.output_guard.guard_outputs` takes the lock of every
output folder (the folder of a file output) before it checks or claims
anything, and the claims object releases them when the command ends, well or
not. A second command writing into the same folder (two ``train`` into one
``--output``, a ``--resume`` of a run that still runs, a study cell resumed
while its job is alive) stops at once with one line naming the process that
holds the folder, before it reads or writes anything there.

The lock is ``filelock``'s: an operating-system lock (``flock``) on the
hidden file ``.detr-peg.lock`` in the folder, so it goes with its process:
a process that was killed holds nothing, and the next command proceeds.
``.detr-peg.lock.json`` beside it says who holds the lock (process, machine,
command, start time), for the message. Both files go when the command ends
(the lock file while still held, so no other process can hold a lock on a
file that is gone), so a folder is left as the command left it; a killed
process leaves them behind, harmless. Within one process the lock is
re-entrant (the demo's run folder is locked by the demo and again by the
training it starts). On file systems shared between machines the lock is as
good as their ``flock`` support: NFS since Linux 2.6.12 maps it to POSIX
locks, which work across clients with a lock daemon; some FUSE and older
network file systems accept the lock without sharing it, where two machines
could still both write.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from detr_peg.errors import UserError
from detr_peg.fileio.json_shape import Fields, Integer, Text, read_json_file
from detr_peg.fileio.os_errors import write_error

#: The lock file and the holder's description, in the locked folder.
LOCK_FILE = ".detr-peg.lock"
HOLDER_FILE = ".detr-peg.lock.json"

#: What :meth:`FolderLock._write_holder` writes.
HOLDER_SHAPE = Fields(
    required={"pid": Integer(minimum=1, maximum=2**31 - 1), "host": Text(), "command": Text(), "since": Text()}
)


def _read_holder(folder: Path) -> dict | None:
    """The holder described in ``folder``'s ``.detr-peg.lock.json``; None when there is none or it is damaged
    (the description is for messages only: bounded, shaped, never an error of its own)."""
    try:
        return read_json_file(Path(folder) / HOLDER_FILE, HOLDER_SHAPE, "Lock holder file", "", kind="lock")
    except UserError:
        return None


def holder_alive(folder: Path, command: str | None = None) -> bool | None:
    """Whether the process described as holding ``folder``'s lock still runs, as far as this machine can tell.

    Read from ``.detr-peg.lock.json`` alone (the lock itself is not tried, so
    a command starting there is never disturbed): None when no holder is
    described (no command holds the folder, or one ended cleanly), or when
    ``command`` is given and the holder is another command; False when the
    holder was a process of this machine that is gone (killed without
    releasing); True when it runs, or runs on another machine, where it
    cannot be told.
    """
    holder = _read_holder(folder)
    if holder is None or (command is not None and holder["command"] != command):
        return None
    pid, host = holder["pid"], holder["host"]
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


class FolderInUse(UserError):
    """Another process holds the folder's lock."""


class FolderLock:
    """The exclusive lock of one output folder.

    Args:
        folder: the folder (created when missing; removed again on release
            if it was created for the lock and nothing else was written there).
        command: the command taking it, for the holder's description.
        option: how the user named the folder (``--output``), for the message.
    """

    def __init__(self, folder: Path, command: str, option: str) -> None:
        self.folder, self.command, self.option = folder, command, option
        self._lock: FileLock | None = None
        self._created = False
        self._new_file = False

    def acquire(self) -> None:
        """Take the lock, or raise :class:`FolderInUse` naming the holder.

        Raises:
            FolderInUse: another process holds the folder.
            OutputError: the folder cannot be created or written (one
                sentence naming it, the reason and what to do), before the
                command has written anything.
        """
        try:
            self._created = not self.folder.exists()
            self.folder.mkdir(parents=True, exist_ok=True)
            self._new_file = not (self.folder / LOCK_FILE).exists()
            lock = FileLock(str(self.folder / LOCK_FILE), timeout=0, is_singleton=True)
            lock.acquire()
        except Timeout:
            raise FolderInUse(self._in_use_message()) from None
        except OSError as exc:
            self._created = False
            if isinstance(exc, FileExistsError):  # mkdir met a file where a folder of the path should be
                exc = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            raise write_error(self.folder, exc, f"write into {self.option}") from None
        self._lock = lock
        if lock.lock_counter == 1:  # the first holder in this process describes itself
            self._write_holder()

    def release(self) -> None:
        """Release the lock (the folder goes again if it was created for it and holds nothing else)."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        last = lock.lock_counter == 1
        if last:
            try:
                (self.folder / HOLDER_FILE).unlink(missing_ok=True)
                if self._new_file:
                    (self.folder / LOCK_FILE).unlink(missing_ok=True)  # while held: see the module docstring
            except OSError:
                pass
        lock.release()
        if last and self._created:
            try:
                self.folder.rmdir()  # only when empty: nothing was written there
            except OSError:
                pass

    def _write_holder(self) -> None:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command,
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        try:
            (self.folder / HOLDER_FILE).write_text(json.dumps(holder) + "\n")
        except OSError:
            pass  # the description is for messages only

    def _in_use_message(self) -> str:
        holder = _read_holder(self.folder)
        who = (
            f"detr-peg {holder['command']} (process {holder['pid']} on {holder['host']}, since {holder['since']})"
            if holder is not None
            else "another detr-peg command"
        )
        return (
            f"{self.option} {self.folder} is in use by {who}; wait for it to end, or stop it, "
            f"or choose another {self.option}."
        )
