"""Deployment: ONNX export of the detectors and inference in ONNX Runtime (optional ``onnx`` extra).

``export_onnx(model, "model.onnx")`` writes one graph for any batch and image
size (:mod:`~detr_peg.export.onnx_export`); ``OnnxDetector("model.onnx")``
runs it with the PyTorch model's interface (:mod:`~detr_peg.export.onnx_runtime`).
The ONNX packages are imported only when used; without them both raise a
one-line :class:`~detr_peg.errors.UserError`.
"""

from detr_peg.export.onnx_export import DEFAULT_OPSET, export_checkpoint, export_onnx
from detr_peg.export.onnx_runtime import OnnxDetector

__all__ = ["DEFAULT_OPSET", "OnnxDetector", "export_checkpoint", "export_onnx"]
