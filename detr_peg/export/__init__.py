"""ONNX export and ONNX Runtime inference (optional ``onnx`` extra); names load lazily, so no torch on import."""

from __future__ import annotations

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

#: The opset the export is tested with (``detr-peg export --opset``).
DEFAULT_OPSET = 18

_EXPORTS = {
    "export_onnx": "detr_peg.export.onnx_export",
    "OnnxDetector": "detr_peg.export.onnx_runtime",
}

__all__, __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, eager=("DEFAULT_OPSET",))
