"""ONNX Runtime session options of the exported detectors, without torch (also used by ``detr-peg bench``).

The memory pattern and the CPU memory arena are off: both keep memory across runs at no speed gain.
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
    """``onnxruntime.SessionOptions`` (``threads`` intra-op, one inter-op); ``ConfigError`` for an unknown level."""
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
    options.log_severity_level = 4  # a failed run is raised (and reported) as an exception, not also logged
    options.enable_mem_pattern = False
    options.enable_cpu_mem_arena = False
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options
