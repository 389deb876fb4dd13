"""Building the official Deformable-DETR CUDA op (``MultiScaleDeformableAttention``) just in time, for
``bench --gpu --official``: a copy of the checkout's ``models/ops/src`` with PyTorch-1.5 APIs replaced
(:data:`SOURCE_FIXES`), compiled with its ``setup.py`` flags, cached in ``$TORCH_EXTENSIONS_DIR``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

from detr_peg.errors import ConfigError

MODULE_NAME = "MultiScaleDeformableAttention"

#: (pattern, replacement) applied to every source file: THC atomics, ``.type()`` and ``.data<T>()`` to current APIs.
SOURCE_FIXES = (
    (re.compile(r"#include\s*<THC/THCAtomics\.cuh>"), "#include <ATen/cuda/Atomic.cuh>"),
    (re.compile(r"\.type\(\)\.is_cuda\(\)"), ".is_cuda()"),
    (re.compile(r"AT_DISPATCH_FLOATING_TYPES\((\w+)\.type\(\)"), r"AT_DISPATCH_FLOATING_TYPES(\1.scalar_type()"),
    (re.compile(r"\.data<"), ".data_ptr<"),
)

#: nvcc flags of the official ``models/ops/setup.py``.
NVCC_FLAGS = (
    "-DWITH_CUDA",
    "-DCUDA_HAS_FP16=1",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
)


def patched_sources(repo: str | os.PathLike, destination: Path) -> list[Path]:
    """Copy ``models/ops/src`` to ``destination`` with :data:`SOURCE_FIXES` applied; returns the files to compile.

    Unchanged files keep their timestamps so ninja reuses a previous build. Raises ConfigError if
    ``repo`` has no ``models/ops/src/vision.cpp``.
    """
    source = Path(repo) / "models" / "ops" / "src"
    if not (source / "vision.cpp").is_file():
        raise ConfigError(
            f"--official {repo} has no models/ops/src/vision.cpp: it is not a checkout of "
            "github.com/fundamentalvision/Deformable-DETR with its CUDA op."
        )
    for path in source.rglob("*"):
        if path.suffix not in (".cpp", ".cu", ".h", ".cuh"):
            continue
        text = path.read_text()
        for pattern, replacement in SOURCE_FIXES:
            text = pattern.sub(replacement, text)
        target = destination / path.relative_to(source)
        # Unchanged files keep their timestamps, so that ninja reuses the previous build.
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return sorted([*destination.glob("*.cpp"), *destination.glob("cpu/*.cpp"), *destination.glob("cuda/*.cu")])


def build_official_op(repo: str | os.PathLike, *, verbose: bool = False):
    """Compile (or load from the cache) the official op's extension module; ConfigError without ``nvcc``."""
    from torch.utils.cpp_extension import CUDA_HOME, load

    if CUDA_HOME is None:
        raise ConfigError(
            "Building the official Deformable-DETR CUDA op needs the CUDA toolkit (nvcc); "
            "set CUDA_HOME to its directory."
        )
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    build_directory = root / f"{MODULE_NAME}_torch{torch.__version__}"
    build_directory.mkdir(parents=True, exist_ok=True)
    sources = patched_sources(repo, build_directory / "src")
    return load(
        name=MODULE_NAME,
        sources=[str(s) for s in sources],
        extra_include_paths=[str(build_directory / "src")],
        extra_cflags=["-O3", "-DWITH_CUDA"],
        extra_cuda_cflags=list(NVCC_FLAGS),
        with_cuda=True,
        build_directory=str(build_directory),
        verbose=verbose,
    )


def install_official_op(repo: str | os.PathLike) -> None:
    """Build the op and make ``import MultiScaleDeformableAttention`` return it."""
    sys.modules[MODULE_NAME] = build_official_op(repo)


def float32_function(function):
    """Wrap ``MSDeformAttnFunction`` to run (and return) float32 under autocast: the op has no bf16/fp16 kernels."""

    class Float32MSDeformAttnFunction:
        @staticmethod
        def apply(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
            with torch.autocast("cuda", enabled=False):
                return function.apply(
                    value.float(),
                    spatial_shapes,
                    level_start_index,
                    sampling_locations.float(),
                    attention_weights.float(),
                    im2col_step,
                )

    return Float32MSDeformAttnFunction
