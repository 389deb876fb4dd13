"""Torch-free checks of an ONNX export's options (packages, opset, traced sizes) and the line said before it starts."""

from __future__ import annotations

import os
import re
import resource
from pathlib import Path

from detr_peg.config.ranges import MAX_TEST_SIDE, is_whole
from detr_peg.errors import ConfigError, UserError
from detr_peg.export import DEFAULT_OPSET
from detr_peg.messages import install_hint


def require_onnx() -> None:
    """Raise a one-line :class:`UserError` when the optional ONNX packages are missing."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"ONNX export and inference need the optional packages {', '.join(missing)}: "
            f"install them with {install_hint('onnx')}."
        )


#: The size traced when ``--image-size`` leaves it dynamic (H, W).
TRACE_SIZE = (96, 128)
#: Peak memory of a forward pass in input sizes (float32 images): a generous bound of the backbone's activations.
ACTIVATIONS_PER_INPUT = 64


def memory_headroom() -> int | None:
    """Bytes this process may still take: the machine's available memory, within ``RLIMIT_AS``; None off Linux."""
    try:
        available = int(re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())[1]) << 10
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            size = int(re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) << 10
            available = min(available, soft - size)
    except (OSError, TypeError):  # no /proc (macOS, Windows), or a field missing
        return None
    return available


def _whole(value: object, low: int, high: int) -> bool:
    return is_whole(value) and low <= value <= high


def check_export_options(opset: int, image_size: tuple[int, int] | None, batch_size: int | None, **flags: bool) -> None:
    """Raise ``ConfigError`` for an opset the installed ``onnx`` lacks, sizes no machine here can trace, or ``flags``
    (``postprocess``, ``optimize``) that are not booleans; every value of its type, as the command line parses it."""
    import onnx.defs

    newest = onnx.defs.onnx_opset_version()
    if not _whole(opset, DEFAULT_OPSET, newest):  # torch's exporter writes nothing older
        raise ConfigError(f"--opset must be a whole number from {DEFAULT_OPSET} (the tested one) to {newest}, the "
                          f"newest of the installed onnx package; got {opset!r}.")  # fmt: skip
    sizes = image_size if isinstance(image_size, (tuple, list)) else (image_size,)
    if image_size is not None and (len(sizes) != 2 or not all(_whole(side, 32, MAX_TEST_SIDE) for side in sizes)):
        raise ConfigError(
            f"--image-size must be two sizes from 32 to {MAX_TEST_SIDE} pixels (H W), got {image_size!r}."
        )
    if batch_size is not None and not _whole(batch_size, 1, 100_000):  # the range of the config's batch sizes
        raise ConfigError(f"--batch-size must be a whole number from 1 to 100000, got {batch_size!r}.")
    (h, w), batch, free = image_size or TRACE_SIZE, batch_size or 2, memory_headroom()
    needed = batch * 3 * h * w * 4 * ACTIVATIONS_PER_INPUT  # traced, then run by the check
    if free is not None and needed > free:  # else the kernel ends the process mid-export, without a word
        raise ConfigError(f"--batch-size {batch} at {h} x {w} pixels needs about {needed / 2**30:.0f} GiB to trace "
                          f"and check, more than the {free / 2**30:.1f} GiB free here; export a smaller batch or "
                          "size.")  # fmt: skip
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ConfigError(f"{name} must be True or False, got {flag!r}.")


def export_note(
    arch: str, output: str | os.PathLike, image_size: tuple[int, int] | None = None, batch_size: int | None = None
) -> str:
    """The line said before an export starts: what goes where, and that dynamic sizes take long."""
    dynamic = [name for name, fixed in (("batch", batch_size), ("size", image_size)) if not fixed]
    slow = f" with dynamic {' and '.join(dynamic)} (can take minutes on a CPU)" if dynamic else ""
    return f"exporting {arch} to {output}{slow} ..."
