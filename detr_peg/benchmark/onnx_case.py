"""The ONNX Runtime case of ``detr-peg bench``: the same model, exported and run on the CPU.

``detr-peg bench --onnx`` adds, after every PyTorch inference case, one case
labelled ``<label> onnxruntime``: the model that case builds (same config,
same random weights) is exported with
:func:`~detr_peg.export.onnx_export.export_onnx` (dynamic batch and size, the
graph users get) into a temporary folder and timed in an ONNX Runtime CPU
session with ``--threads`` intra-op threads. The export happens before the
timed runs; peak memory is the whole process's, so it includes the PyTorch
model and the export. No FLOPs are counted for it (the graph is the same
model).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from torch import Tensor, nn

ONNX_IMPL = "onnxruntime"


def onnx_forward(model: nn.Module, threads: int) -> Callable[[Tensor, Tensor], dict]:
    """Export ``model`` and return ``forward(images, mask)`` running it in ONNX Runtime."""
    from detr_peg.export.onnx_export import export_onnx
    from detr_peg.export.onnx_runtime import OnnxDetector

    with tempfile.TemporaryDirectory(prefix="detr_peg_bench_") as folder:
        path = export_onnx(model.eval(), Path(folder) / "model.onnx")
        detector = OnnxDetector(path, threads=threads)  # the session holds the graph; the file can go
    return detector
