"""Atomic file writing: a crash, a signal or a full disk never leaves a half-written file under the final name.

Every file detr_peg writes (checkpoints, configs, metrics, detections,
benchmark reports) goes through :func:`atomic_write`: the content is written
into a temporary file in the same folder, flushed and ``fsync``-ed, renamed
over the target with ``os.replace`` (atomic on POSIX and Windows), and the
folder is ``fsync``-ed so the rename itself survives a power cut. The
temporary file is ``.NAME.tmp-PID``; one left by a writer that was killed
mid-write is removed by the next write of the same file, once that process is
gone.
``torch.save`` goes through it in
:func:`detr_peg.fileio.checkpoint_files.atomic_torch_save`. This module needs
no torch, so the config layer stays light to import.
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
    """Write a file atomically: ``write(handle)`` into a temporary file, fsync, rename over ``path``.

    Args:
        path: the final file.
        write: writes the content into the binary file object it is given.
        error: on an ``OSError`` (unwritable folder, full disk, a name too
            long), raise this error class with the one-sentence message of
            :func:`~detr_peg.fileio.os_errors.write_error` (the path, the
            reason, what to do); ``None`` re-raises the ``OSError`` itself.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError or ``error``: the write failed; the previous file at ``path``
            (if any) is left untouched and the temporary file is removed.
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
    """Remove the folders ``folder/PREFIX<pid>`` of processes that no longer exist (a killed command's staging).

    Returns:
        The folders removed.
    """
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
    """Write ``data`` as JSON atomically (see :func:`~detr_peg.fileio.atomic_write`); ``indent=None`` writes it
    compactly.

    Raises:
        OutputError: the folder is not writable, the name too long or the disk full.
    """
    separators = None if indent is not None else (",", ":")
    text = json.dumps(data, indent=indent, separators=separators) + "\n"
    return atomic_write_text(path, text)


def save_image(path: str | os.PathLike, image: Any, **options: Any) -> Path:
    """Save a ``PIL.Image.Image`` atomically, in the format its suffix names (``.png``, ``.jpg``, ...)."""
    fmt = _format_of(path)
    return atomic_write(path, lambda handle: image.save(handle, format=fmt, **options))


def save_figure(path: str | os.PathLike, figure: Any, **options: Any) -> Path:
    """Save a Matplotlib figure atomically, in the format its suffix names (``.png``, ``.pdf``, ``.svg``).

    A PDF gets no creation date (unless ``metadata`` says otherwise), so redrawing the same figure writes the
    same bytes (as PNG does) and committed figures change only when what they show does.
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
