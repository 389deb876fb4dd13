"""Torch-free checks of an ONNX export's options (packages, opset, traced sizes) and the line said before it starts."""

from __future__ import annotations

import os

from detr_peg.config.ranges import MAX_TEST_SIDE
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


def check_export_options(opset: int, image_size: tuple[int, int] | None, batch_size: int | None) -> None:
    """Raise ``ConfigError`` for an opset the installed ``onnx`` lacks, or sizes no machine here can trace."""
    import onnx.defs

    newest = onnx.defs.onnx_opset_version()
    if opset < DEFAULT_OPSET:  # torch's exporter writes nothing older
        raise ConfigError(f"--opset {opset} is too old: torch's ONNX exporter writes opset {DEFAULT_OPSET} or newer.")
    if opset > newest:
        raise ConfigError(
            f"--opset {opset} is newer than the newest opset of the installed onnx package ({newest}); "
            f"use {DEFAULT_OPSET} (the tested one) to {newest}."
        )
    if image_size is not None and (len(image_size) != 2 or not all(32 <= side <= MAX_TEST_SIDE for side in image_size)):
        raise ConfigError(
            f"--image-size must be two sizes from 32 to {MAX_TEST_SIDE} pixels (H W), got {tuple(image_size)}."
        )
    if batch_size is not None and not 1 <= batch_size <= 100_000:  # the range of the config's batch sizes
        raise ConfigError(f"--batch-size must be from 1 to 100000, got {batch_size}.")


def export_note(
    arch: str, output: str | os.PathLike, image_size: tuple[int, int] | None = None, batch_size: int | None = None
) -> str:
    """The line said before an export starts: what goes where, and that dynamic sizes take long."""
    dynamic = [name for name, fixed in (("batch", batch_size), ("size", image_size)) if not fixed]
    slow = f" with dynamic {' and '.join(dynamic)} (can take minutes on a CPU)" if dynamic else ""
    return f"exporting {arch} to {output}{slow} ..."
