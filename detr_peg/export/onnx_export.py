"""ONNX export of DETR and Deformable-DETR: one graph for any batch size and image size.

Inputs: ``images`` ``float32[B, 3, H, W]`` (normalised, zero padding, images top-left), ``mask``
``bool[B, H, W]`` (True = padding), with ``postprocess=True`` ``orig_sizes`` ``int64[B, 2]`` (h, w).
Outputs: ``pred_logits`` ``[B, Q, K + 1]`` (DETR, last = no object) or ``[B, Q, K]`` (Deformable),
``pred_boxes`` ``[B, Q, 4]`` normalised (cx, cy, w, h) of the unpadded image; with ``postprocess``
also ``scores`` ``[B, N]``, ``labels`` ``int64[B, N]``, ``boxes`` ``[B, N, 4]`` (x0, y0, x1, y1) pixels.
The config and label map are stored in the metadata (``detr_peg.config``, ``detr_peg.label_map``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from detr_peg.config.loader import config_to_dict
from detr_peg.errors import ConfigError
from detr_peg.export import DEFAULT_OPSET
from detr_peg.export.export_options import TRACE_SIZE, check_export_options, export_note, require_onnx
from detr_peg.models.loading import LoadedModel
from detr_peg.models.postprocess import Postprocessor
from detr_peg.models.registry import attention_impl
from detr_peg.outputs import write_error

logger = logging.getLogger(__name__)

#: The smallest padded side a dynamic-size graph takes: the coarsest map must be at least 2 pixels,
#: as sizes 0 and 1 are special cases that the traced graph does not keep.
MIN_SIZE = 65
INPUT_NAMES = ("images", "mask", "orig_sizes")
OUTPUT_NAMES = ("pred_logits", "pred_boxes", "scores", "labels", "boxes")
METADATA_CONFIG = "detr_peg.config"
METADATA_LABEL_MAP = "detr_peg.label_map"
METADATA_SIZE_DIVISIBILITY = "detr_peg.size_divisibility"


class ExportWrapper(nn.Module):
    """The detector with tensor outputs (and optionally its post-processor): what the exported graph computes."""

    def __init__(self, model: nn.Module, postprocessor: Postprocessor | None = None) -> None:
        super().__init__()
        self.model = model
        self.postprocessor = postprocessor

    def forward(self, images: Tensor, mask: Tensor, orig_sizes: Tensor | None = None) -> tuple[Tensor, ...]:
        """See the module docstring for the inputs and outputs."""
        out = self.model(images, mask)
        logits, boxes = out["pred_logits"], out["pred_boxes"]
        if self.postprocessor is None:
            return logits, boxes
        if orig_sizes is None:
            raise ValueError("post-processing needs orig_sizes Tensor[B, 2] (h, w)")
        return (logits, boxes, *self.postprocessor.tensors(logits, boxes, orig_sizes))


def export_attention(model: nn.Module) -> contextlib.AbstractContextManager:
    """Run every switchable attention layer with its export implementation (``grid_sample_sum``), then restore it."""
    return attention_impl(model, lambda kind: kind.export)


def example_inputs(batch_size: int, image_size: tuple[int, int], postprocess: bool) -> tuple[Tensor, ...]:
    """Inputs to trace with: a padded batch whose last image is smaller than the rest (fixed; torch's generator
    is not advanced)."""
    h, w = image_size
    images = torch.randn(batch_size, 3, h, w, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(batch_size, h, w, dtype=torch.bool)
    if batch_size > 1:
        mask[-1, h - h // 4 :, :] = True
        mask[-1, :, w - w // 4 :] = True
        images.masked_fill_(mask[:, None], 0.0)
    sizes = torch.stack([(~mask).sum(1).amax(1), (~mask).sum(2).amax(1)], 1)  # unpadded (h, w)
    return (images, mask, sizes) if postprocess else (images, mask)


def export_onnx(
    model: LoadedModel | nn.Module,
    output: str | os.PathLike,
    *,
    opset: int = DEFAULT_OPSET,
    image_size: tuple[int, int] | None = None,
    batch_size: int | None = None,
    postprocess: bool = False,
    optimize: bool = True,
    check: Callable[[Path], object] | None = None,
) -> Path:
    """Export a detector (a ``LoadedModel``, or a bare detector without metadata) to ``output``, atomically; the path.

    ``opset``: 18 (tested) or newer, when torch can convert the model to it; ``image_size=(H, W)`` / ``batch_size``
    fix sizes, else dynamic; ``postprocess`` adds ``orig_sizes`` and post-processed outputs; ``optimize`` runs the
    exporter's optimizer; ``check(path)`` runs on the written graph before it replaces ``output`` (what it raises
    leaves ``output`` as it was).
    Raises ``UserError``: ONNX packages missing, invalid option, unwritable file.
    """
    require_onnx()
    check_export_options(opset, image_size, batch_size, postprocess=postprocess, optimize=optimize)
    opset, batch_size = int(opset), None if batch_size is None else int(batch_size)  # NumPy's integers too
    image_size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    loaded = model if isinstance(model, LoadedModel) else None
    model = loaded.model if loaded is not None else model
    if postprocess and loaded is None:
        raise ConfigError("postprocess=True needs a LoadedModel (the architecture's post-processor comes with it).")
    output = Path(output)
    arch = loaded.config.model.arch if loaded is not None else type(model).__name__
    logger.info(export_note(arch, output, image_size, batch_size))
    wrapper = ExportWrapper(model.eval(), loaded.postprocessor if postprocess else None).eval()
    inputs = example_inputs(batch_size or 2, tuple(image_size or TRACE_SIZE), postprocess)
    dims = _dynamic_shapes(dynamic_batch=batch_size is None, dynamic_size=image_size is None, postprocess=postprocess)
    names = INPUT_NAMES[: len(inputs)]
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        with export_attention(model), torch.no_grad(), _quiet_exporter():
            program = torch.onnx.export(
                wrapper,
                inputs,
                dynamo=True,
                opset_version=opset,
                input_names=list(names),
                output_names=list(OUTPUT_NAMES[: 5 if postprocess else 2]),
                dynamic_shapes=dims,
                optimize=optimize,
                verbose=False,
            )
        written = {entry.domain: entry.version for entry in program.model_proto.opset_import}.get("")
        if written != opset:  # torch keeps the opset it could not convert from, and says so only in a log line
            raise ConfigError(
                f"opset {opset}: torch's ONNX exporter could not convert the model to it and wrote opset {written}; "
                f"choose opset {written} (nothing was written)."
            )
        metadata = {"detr_peg.opset": str(opset), METADATA_SIZE_DIVISIBILITY: str(model.size_divisibility)}
        if loaded is not None:
            metadata[METADATA_CONFIG] = json.dumps(config_to_dict(loaded.config))
            metadata[METADATA_LABEL_MAP] = json.dumps(loaded.label_map.to_dict() if loaded.label_map else None)
        _write(program, tmp, metadata)
        if check is not None:
            check(tmp)
        os.replace(tmp, output)
    except OSError as exc:
        raise write_error(output, exc) from None
    finally:
        tmp.unlink(missing_ok=True)
    return output


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's expected warnings (unfolded ``Split``, equal dynamic axes); errors still raise."""
    logger = logging.getLogger("onnxscript")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*axis name.*will not be used", category=UserWarning)
            yield
    finally:
        logger.setLevel(level)


def _dynamic_shapes(*, dynamic_batch: bool, dynamic_size: bool, postprocess: bool) -> tuple | None:
    if not dynamic_batch and not dynamic_size:
        return None
    batch = torch.export.Dim("batch", min=1, max=1024) if dynamic_batch else None
    height = torch.export.Dim("height", min=MIN_SIZE, max=8192) if dynamic_size else None
    width = torch.export.Dim("width", min=MIN_SIZE, max=8192) if dynamic_size else None
    images = {k: v for k, v in {0: batch, 2: height, 3: width}.items() if v is not None}
    mask = {k: v for k, v in {0: batch, 1: height, 2: width}.items() if v is not None}
    shapes = (images, mask)
    if postprocess:
        shapes = (*shapes, {0: batch} if batch is not None else {})
    return shapes


def _write(program, path: Path, metadata: dict[str, str]) -> None:
    """Save the exported program with ``metadata`` in the model's ``metadata_props``."""
    import onnx

    proto = program.model_proto
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save_model(proto, str(path))
