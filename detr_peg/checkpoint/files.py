"""Checkpoint and weight files: safe reading (local paths or URLs) and atomic ``torch.save``. ``torch.load`` runs with
``weights_only=True`` (plus ``argparse.Namespace``, which the official scripts store under ``args``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import re
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from detr_peg.bounded_read import check_regular_file
from detr_peg.errors import CheckpointError, UserError
from detr_peg.outputs import atomic_write, make_folder

SAFE_GLOBALS = [argparse.Namespace]


def is_url(spec: str) -> bool:
    """True for ``http://`` and ``https://`` locations (in any case); CheckpointError for another scheme."""
    scheme = re.match(r"([A-Za-z][\w+.-]*)://", spec)
    if scheme and scheme[1].lower() not in ("http", "https"):
        raise CheckpointError(f"{spec}: detr-peg does not read {scheme[1]}:// locations; give a local path or an "
                              "http(s):// URL.")  # fmt: skip
    return scheme is not None


def check_checkpoint_file(path: str | os.PathLike, what: str = "checkpoint") -> int:
    """Check that ``path`` is a readable regular file within the checkpoint limit; return its size (CheckpointError).

    A folder holding a run's ``checkpoint.pth`` or a Hub folder's ``model.safetensors`` is answered with that file.
    """
    held = next(
        (file for file in (Path(path, "checkpoint.pth"), Path(path, "model.safetensors")) if file.is_file()), None
    )
    if held is not None:  # only a folder holds files
        raise CheckpointError(f"The {what} file {path} is a folder; give the file it holds, {held}.")
    return check_regular_file(path, f"The {what} file", "checkpoint", CheckpointError)


def check_checkpoint_location(spec: str | os.PathLike, what: str = "checkpoint") -> None:
    """:func:`check_checkpoint_file` for a local path; a URL passes (it is checked once downloaded)."""
    if not is_url(os.fsdecode(spec)):
        check_checkpoint_file(os.fsdecode(spec), what)


#: Seconds a download waits for the server, to connect or between two reads.
DOWNLOAD_TIMEOUT = 60.0


def fetch_url(url: str) -> Path:
    """Download ``url`` into torch's hub cache (once per URL) and return the local path.

    The file is kept under a folder named by the URL's hash (``.../a/checkpoint.pth`` and ``.../b/checkpoint.pth``
    are two files); a download cut short, or silent for :data:`DOWNLOAD_TIMEOUT` seconds, keeps nothing.
    """
    import http.client
    import urllib.request

    from torch.hub import get_dir
    from tqdm import tqdm

    cache = Path(get_dir()) / "checkpoints" / hashlib.sha256(url.encode()).hexdigest()[:16]
    target = cache / (os.path.basename(url.split("?")[0]) or "download")

    def download(handle: BinaryIO) -> None:
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
                size, got = int(response.headers.get("Content-Length") or -1), 0
                shown = bool(sys.stderr and sys.stderr.isatty())
                with tqdm(
                    total=max(size, 0) or None, unit="B", unit_scale=True, desc=target.name, disable=not shown
                ) as bar:
                    while chunk := response.read(1 << 20):
                        got += handle.write(chunk)
                        bar.update(len(chunk))
        except (OSError, ValueError, http.client.HTTPException) as exc:  # network errors come in many types
            raise CheckpointError(f"Could not download {url}: {exc}.") from None
        if size >= 0 and got != size:
            raise CheckpointError(f"Could not download {url}: the server sent {got} of the {size} bytes it announced.")

    if not target.is_file():
        make_folder(cache)
        atomic_write(target, download, error=CheckpointError)  # nothing under the name unless complete
    return target


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a safetensors file (``.safetensors`` in any case), read and written as such."""
    return Path(path).suffix.lower() == ".safetensors"


def read_checkpoint_file(path: str | os.PathLike, *, what: str = "checkpoint") -> Any:
    """Load a ``.pth``/``.pt`` file safely, or a ``.safetensors`` one as ``{"state_dict": ..., "metadata": ...}``.

    Raises CheckpointError: missing, unreadable, truncated or corrupt, or holding pickled objects.
    """
    import torch  # imported on reading: checking a path alone must not import torch

    spec = os.fsdecode(path)
    if is_url(spec):
        local = fetch_url(spec)
        try:
            return read_checkpoint_file(local, what=what)
        except CheckpointError as exc:  # a download that is no checkpoint (a web page) is not kept for the next try
            local.unlink(missing_ok=True)
            raise CheckpointError(str(exc).replace(str(local), spec)) from None
    local = Path(spec)
    check_checkpoint_file(local, what)
    if local.suffix.lower() == ".onnx":
        raise CheckpointError(
            f"The {what} file {spec} is an ONNX graph: run it with predict --onnx or Detector.from_onnx."
        )
    if is_safetensors(local):
        return _read_safetensors(local, what)
    with open(local, "rb") as handle:  # readable: checked above
        head = handle.read(32)
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip archive, or its older pickle
        raise CheckpointError(f"The {what} file {spec} is not a PyTorch checkpoint: it begins with "
                              f"{head.decode('utf-8', 'replace')!r}, not as torch.save writes.")  # fmt: skip
    try:
        # The unpickler warns about pickle protocols torch does not write; a failure is reported below.
        with torch.serialization.safe_globals(SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            with warnings.catch_warnings():
                # A sparse tensor is validated by torch (and then refused as a weight by the checkpoint checks).
                warnings.filterwarnings("ignore", message="Validating sparse tensor invariants")
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


#: What wrappers put before every key of a model's state dict: DDP (``module.``), torch.compile (``_orig_mod.``).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def unwrapped(state: dict) -> dict:
    """``state`` without the prefixes of :data:`WRAPPER_PREFIXES` that every one of its keys carries."""
    while state and (prefix := next((p for p in WRAPPER_PREFIXES if all(str(k).startswith(p) for k in state)), None)):
        state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def _unsafe_global(text: str) -> str | None:
    """The module-qualified name the weights-only unpickler refused, or None (wording varies by torch version)."""
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


def atomic_torch_save(obj: Any, path: str | os.PathLike, *, error: type[UserError] = CheckpointError) -> Path:
    """``torch.save`` atomically; raises ``error`` on failure, the previous file untouched."""
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle), error=error)
