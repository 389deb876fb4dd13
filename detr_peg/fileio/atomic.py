"""Atomic file writing: ``.NAME.tmp-PID`` in the same folder, fsync, ``os.replace``, fsync of the folder ("Atomic
files" in docs/guarantees.md). Torch-free, so the config layer stays light to import.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from detr_peg.errors import OutputError, UserError
from detr_peg.fileio.os_errors import write_error


def atomic_write(
    path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, error: type[UserError] | None = OutputError
) -> Path:
    """Write ``path`` atomically with ``write(handle)``; temporaries of killed writers are removed afterwards.

    Raises ``error`` (None: the OSError) with the :func:`write_error` sentence; the previous file is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            recorder = _ErrorRecordingFile(handle)
            try:
                write(recorder)
            except RuntimeError:
                # torch.save reports a failed write as a RuntimeError without the cause.
                if recorder.error is not None:
                    raise recorder.error from None
                raise
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if error is None:
            raise
        raise error(str(write_error(path, exc))) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    _remove_stale_temporaries(path)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, error: type[UserError] | None = OutputError) -> Path:
    """Write ``text`` as UTF-8 atomically (see :func:`atomic_write`)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda handle: handle.write(data), error=error)


class _ErrorRecordingFile:
    """A binary file object that passes writes on and keeps the first ``OSError`` they raise."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._handle.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:
        """Everything else of the file (``tell``, ``seek``: the PDF writer asks for them) is the file's own."""
        return getattr(self._handle, name)


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files of ``path`` whose writer process no longer exists (killed mid-write)."""
    if os.name != "posix":  # os.kill(pid, 0) only probes a process on POSIX
        return
    try:
        leftovers = list(path.parent.glob(f".{glob.escape(path.name)}.tmp-*"))
    except OSError:
        return
    for tmp in leftovers:
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_exists(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def remove_stale_folders(folder: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove the folders ``folder/PREFIX<pid>`` of processes that no longer exist; return them."""
    if os.name != "posix":
        return []
    removed = []
    try:
        candidates = list(Path(folder).glob(f"{glob.escape(prefix)}*"))
    except OSError:
        return []
    for candidate in candidates:
        pid = candidate.name[len(prefix) :]
        if candidate.is_dir() and not candidate.is_symlink() and pid.isdigit() and int(pid) != os.getpid():
            if not _process_exists(int(pid)):
                shutil.rmtree(candidate, ignore_errors=True)
                removed.append(candidate)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists but belongs to someone else
        return True
    return True


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; best effort (not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON atomically (``indent=None``: compactly); raises OutputError."""
    separators = None if indent is not None else (",", ":")
    text = json.dumps(data, indent=indent, separators=separators) + "\n"
    return atomic_write_text(path, text)


def save_image(path: str | os.PathLike, image: Any, **options: Any) -> Path:
    """Save a ``PIL.Image.Image`` atomically, in the format its suffix names (``.png``, ``.jpg``, ...)."""
    fmt = _format_of(path)
    return atomic_write(path, lambda handle: image.save(handle, format=fmt, **options))


def save_figure(path: str | os.PathLike, figure: Any, **options: Any) -> Path:
    """Save a Matplotlib figure atomically, in the format its suffix names; a PDF gets no creation date, so
    redrawing writes the same bytes.
    """
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt == "pdf":
        options.setdefault("metadata", {"CreationDate": None})
    return atomic_write(path, lambda handle: figure.savefig(handle, format=fmt, **options))


def _format_of(path: str | os.PathLike) -> str:
    """Pillow's format name for a file suffix (``.jpg`` -> ``JPEG``)."""
    from PIL import Image

    suffix = Path(path).suffix.lower()
    Image.init()
    if suffix not in Image.EXTENSION:
        raise ValueError(f"{path}: no image format has the suffix {suffix!r}")
    return Image.EXTENSION[suffix]
