"""ONNX Runtime session options for the exported detectors, without torch.

:class:`~detr_peg.export.onnx_runtime.OnnxDetector` and the ONNX Runtime case
of ``detr-peg bench`` (a process that imports ONNX Runtime and NumPy only, as
a deployment does) open their sessions with :func:`session_options`, so the
bench times the settings users get.

Two of ONNX Runtime's defaults are changed, both to lower the peak memory at
the same speed (measured on the Export page):

* the memory pattern is off: it plans one block for all the intermediate
  tensors of a run and keeps it for the next run of the same input shape, on
  top of what the allocator already holds;
* the CPU memory arena is off: it grows by powers of two and keeps what it
  took; the C library's allocator serves the same blocks (and with
  :func:`~detr_peg.engine.memory_allocator.retain_freed_memory`, which the
  ``detr-peg`` command and the bench call, reuses them the same way).

The graph optimization level stays ONNX Runtime's default, ``"all"``
(constant folding, node fusions and, on the CPU, the blocked ``NCHWc`` layout
for convolutions), chosen by name from :data:`GRAPH_OPTIMIZATION_LEVELS`.
"""

from __future__ import annotations

from detr_peg.errors import ConfigError

#: ``graph_optimization`` names -> ``onnxruntime.GraphOptimizationLevel`` member names.
GRAPH_OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def session_options(threads: int | None = None, graph_optimization: str = "all"):
    """The ``onnxruntime.SessionOptions`` of the exported detectors (see the module docstring).

    Args:
        threads: intra-op threads (one inter-op thread), or None for ONNX Runtime's choice.
        graph_optimization: a key of :data:`GRAPH_OPTIMIZATION_LEVELS`.

    Raises:
        ConfigError: an unknown ``graph_optimization`` name.
    """
    if graph_optimization not in GRAPH_OPTIMIZATION_LEVELS:
        raise ConfigError(
            f"graph_optimization={graph_optimization!r} is not an ONNX Runtime graph optimization level: "
            f"valid are {', '.join(GRAPH_OPTIMIZATION_LEVELS)}."
        )
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[graph_optimization]
    )
    options.enable_mem_pattern = False
    options.enable_cpu_mem_arena = False
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options
