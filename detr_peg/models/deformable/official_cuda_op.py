"""Building the official Deformable-DETR CUDA op (``MultiScaleDeformableAttention``) on this machine.

On a GPU, ``detr-peg bench --gpu --official PATH`` measures the official
Deformable-DETR with its own compiled op, as its README has users build it
(``models/ops/make.sh``), rather than the pure-PyTorch core used on CPUs. The
op is compiled from the checkout's ``models/ops/src`` with
:func:`torch.utils.cpp_extension.load` (just in time, cached in
``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``, so only the
first case pays for it), for the GPUs of this machine unless
``TORCH_CUDA_ARCH_LIST`` says otherwise, with the compiler flags of its
``setup.py``.

The sources were written for PyTorch 1.5 and use APIs that current releases
deprecate or keep only as compatibility shims; a copy of them gets their
current equivalents (the kernels themselves are untouched):

* ``#include <THC/THCAtomics.cuh>`` becomes ``#include <ATen/cuda/Atomic.cuh>``
  (THC was removed in PyTorch 1.11; the header is a shim that includes this one);
* ``x.type().is_cuda()`` becomes ``x.is_cuda()``,
  ``AT_DISPATCH_FLOATING_TYPES(x.type(), ...)`` takes ``x.scalar_type()`` and
  ``x.data<T>()`` becomes ``x.data_ptr<T>()``.

The op has float32 and float64 kernels only. Under bfloat16 autocast the
official module would hand it bfloat16 values, so :func:`float32_function`
wraps ``MSDeformAttnFunction`` to cast its inputs to float32, as the forks of
Deformable-DETR that train with AMP do (``custom_fwd(cast_inputs=torch.float32)``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

from detr_peg.errors import ConfigError

MODULE_NAME = "MultiScaleDeformableAttention"

#: (pattern, replacement) applied to every source file; see the module docstring.
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
    """Copy ``models/ops/src`` of the checkout to ``destination`` with :data:`SOURCE_FIXES` applied.

    Returns the ``.cpp`` and ``.cu`` files to compile (``vision.cpp``, the CPU
    stubs and the CUDA kernels, as ``setup.py`` globs them).
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
    """Compile (or load from the cache) the official op; returns the extension module.

    Raises:
        ConfigError: when the CUDA toolkit (``nvcc``) is not found.
    """
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
    """Wrap the official ``MSDeformAttnFunction`` so that it runs in float32 under autocast.

    The result stays float32; the official module's ``output_proj`` (an
    ``nn.Linear``) casts it back under autocast.
    """

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
