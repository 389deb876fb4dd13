"""Deployment: ONNX export of the detectors and inference in ONNX Runtime (optional ``onnx`` extra).

``export_onnx(loaded, "model.onnx")`` writes one graph for any batch and image
size (:mod:`~detr_peg.export.onnx_export`); ``OnnxDetector("model.onnx")``
runs it with the PyTorch model's interface (:mod:`~detr_peg.export.onnx_runtime`);
``detr_peg.Detector.export_onnx`` and ``Detector.from_onnx`` do both for a
:class:`~detr_peg.Detector`. The ONNX packages are imported only when used;
without them both raise a one-line :class:`~detr_peg.errors.UserError`.
Names are imported lazily, so ``detr-peg export --help`` loads no torch.
"""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

#: The opset the export is tested with (``detr-peg export --opset``).
DEFAULT_OPSET = 18

_EXPORTS = {
    "export_checkpoint": "detr_peg.export.onnx_export",
    "export_onnx": "detr_peg.export.onnx_export",
    "OnnxDetector": "detr_peg.export.onnx_runtime",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, eager=("DEFAULT_OPSET",))
