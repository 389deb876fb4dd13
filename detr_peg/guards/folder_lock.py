"""One command per output folder: a ``filelock`` (``flock``) on ``.detr-peg.lock`` in each folder a command writes.

``.detr-peg.lock.json`` names the holder for messages; both files go on release. Re-entrant within one process.
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
    """The holder described in ``folder``'s ``.detr-peg.lock.json``; None when absent or damaged."""
    try:
        return read_json_file(Path(folder) / HOLDER_FILE, HOLDER_SHAPE, "Lock holder file", "", kind="lock")
    except UserError:
        return None


def holder_alive(folder: Path, command: str | None = None) -> bool | None:
    """Whether the holder described in ``.detr-peg.lock.json`` still runs (the lock itself is not tried).

    None: no holder, or another ``command``'s; False: a gone process of this machine; True: running, or elsewhere.
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
    """The exclusive lock of one output folder (created when missing, removed on release if still empty)."""

    def __init__(self, folder: Path, command: str, option: str) -> None:
        self.folder, self.command, self.option = folder, command, option
        self._lock: FileLock | None = None
        self._created = False
        self._new_file = False

    def acquire(self) -> None:
        """Take the lock; raises FolderInUse naming the holder, or OutputError when the folder cannot be written."""
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
        """Release the lock; its files go, and the folder too if it was created for the lock and is empty."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        last = lock.lock_counter == 1
        if last:
            try:
                (self.folder / HOLDER_FILE).unlink(missing_ok=True)
                if self._new_file:
                    (self.folder / LOCK_FILE).unlink(missing_ok=True)  # while held: no one can lock a gone file
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
