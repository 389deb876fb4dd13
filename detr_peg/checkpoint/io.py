"""Safe reading and atomic writing of checkpoint files.

Reading never unpickles arbitrary objects: ``torch.load`` runs with
``weights_only=True`` (tensors, plain containers and numbers only; the
``argparse.Namespace`` that the official training scripts store under
``args`` is the one class allowed besides). ``.safetensors`` files are read
with safetensors. Writing goes to a temporary file in the same folder which is
flushed, synced and then renamed over the target, so a crash or a full disk
never leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from detr_peg.errors import CheckpointError

SAFE_GLOBALS = [argparse.Namespace]


def is_url(spec: str) -> bool:
    """True for ``http://`` and ``https://`` locations."""
    return spec.startswith(("http://", "https://"))


def fetch_url(url: str) -> Path:
    """Download ``url`` into torch's hub cache (once) and return the local path."""
    from torch.hub import download_url_to_file, get_dir

    cache = Path(get_dir()) / "checkpoints"
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / os.path.basename(url.split("?")[0])
    if not target.is_file():
        try:
            download_url_to_file(url, str(target), progress=True)
        except Exception as exc:  # network errors come in many types
            raise CheckpointError(f"Could not download {url}: {exc}.") from None
    return target


def read_checkpoint_file(path: str | os.PathLike, *, what: str = "checkpoint") -> Any:
    """Load a ``.pth``/``.pt`` file safely, or a ``.safetensors`` file.

    Args:
        path: local file path or ``http(s)://`` URL.
        what: what the file is, in words, for error messages.

    Returns:
        The stored object (a dict for every file detr_peg reads). For
        safetensors files: ``{"state_dict": tensors, "metadata": dict[str, str]}``.

    Raises:
        CheckpointError: missing, unreadable, truncated or corrupt file, or a
            file that holds pickled Python objects other than plain data.
    """
    spec = str(path)
    local = fetch_url(spec) if is_url(spec) else Path(spec)
    if not local.exists():
        raise CheckpointError(f"The {what} file {spec} does not exist.")
    if not local.is_file():
        raise CheckpointError(f"The {what} path {spec} is not a file.")
    if local.suffix == ".safetensors":
        return _read_safetensors(local, what)
    try:
        # The unpickler warns about pickle protocols torch does not write; a failure is reported below.
        with torch.serialization.safe_globals(SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(local, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        culprit = _unsafe_global(text)
        if culprit is not None:
            raise CheckpointError(
                f"The {what} file {spec} holds a pickled Python object ({culprit}) that could run code when "
                "loaded; refusing to load it (only tensors and plain data are accepted: save a state dict)."
            ) from None
        raise CheckpointError(
            f"The {what} file {spec} is corrupt, truncated or not a PyTorch checkpoint ({_unpickler_reason(text)})."
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as exc:
        # The first sentence only: torch appends paragraphs of advice.
        first = str(exc).splitlines()[0].split(". ")[0].rstrip(".") if str(exc) else type(exc).__name__
        raise CheckpointError(f"The {what} file {spec} is corrupt or truncated ({first}).") from None


def _unsafe_global(text: str) -> str | None:
    """The module-qualified name the weights-only unpickler refused, or None if it refused no name.

    torch words it "Unsupported global: GLOBAL os.system ..." or "unsupported GLOBAL posix.system whose
    module posix is blocked", depending on the version and the name.
    """
    match = re.search(r"GLOBAL ([\w.]+)", text)
    return match.group(1) if match else None


def _unpickler_reason(text: str) -> str:
    """The weights-only unpickler's own reason (e.g. "Unsupported operand 123") without torch's advice."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.endswith("WeightsUnpickler error:") and index + 1 < len(lines):
            return lines[index + 1].rstrip(".")
    return lines[0].rstrip(".") if lines else "unreadable pickle data"


def _read_safetensors(path: Path, what: str) -> dict[str, Any]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"The {what} file {path} is not a valid safetensors file ({exc}).") from None
    return {"state_dict": tensors, "metadata": dict(metadata)}


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Write a file atomically: ``write(handle)`` into a temporary file, fsync, rename over ``path``.

    Args:
        path: the final file.
        write: writes the content into the binary file object it is given.

    Raises:
        CheckpointError: the folder is not writable or the disk is full; the
            previous file at ``path`` (if any) is left untouched and the
            temporary file is removed.
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
        raise CheckpointError(f"Could not write {path}: {exc.strerror or exc}.") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` atomically (see :func:`atomic_write`).

    Raises:
        CheckpointError: the folder is not writable or the disk is full; the
            previous file at ``path`` (if any) is left untouched.
    """
    atomic_write(path, lambda handle: torch.save(obj, handle))


class _ErrorRecordingFile:
    """A binary file object that passes writes on and keeps the first ``OSError`` they raise."""

    def __init__(self, handle: Any) -> None:
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


def _fsync_dir(folder: Path) -> None:
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
