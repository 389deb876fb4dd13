"""``detr-peg bench --gpu``: what can be checked on a machine without a GPU.

The mode refuses to start without a CUDA device (one line, through the CLI);
its case plan, the images/s table, the attention implementation handed to the
worker, and the preparation of the official CUDA op's sources (the edits a
current PyTorch needs) are checked directly. The timings themselves need a GPU.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

from detr_peg.lab.benchmark.gpu import add_throughput, format_throughput, plan_gpu_cases
from detr_peg.lab.benchmark.worker import Case, _build
from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.official_cuda_op import float32_function, patched_sources
from detr_peg.models.registry import MODELS
from tests.conftest import REPO_ROOT, python_env

SIZES = {"infer": (64, 96), "train": (64, 64)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_gpu_mode_without_cuda_is_one_line_error():
    env = python_env()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "detr_peg.cli.main",
            "bench",
            "--config",
            "configs/demo.yaml",
            "--gpu",
            "--official",
            "../Deformable-DETR",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    expected = (
        f"detr-peg bench: error: --gpu needs a CUDA device, but torch {torch.__version__} ({build}) sees "
        "none on this machine; run it where nvidia-smi lists a GPU, or drop --gpu to measure the CPU."
    )
    assert proc.stderr.strip().splitlines() == [expected], proc.stderr
    assert proc.stdout == ""


def _base(arch: str) -> Case:
    return Case(
        label="detr_peg",
        impl="detr_peg",
        mode="infer",
        arch=arch,
        config="configs/demo.yaml",
        overrides=["model.num_classes=4"],
        batch=4,
    )


def test_deformable_plan_official_first_then_each_attention_impl():
    cases = plan_gpu_cases(
        _base("deformable_detr"),
        modes=["infer", "train"],
        sizes=SIZES,
        official_repo="../Deformable-DETR",
        official_args=["--two_stage"],
    )
    assert [(c.label, c.mode, c.attention_impl) for c in cases] == [
        ("official (CUDA op)", "infer", None),
        ("detr_peg triton", "infer", "triton"),
        ("detr_peg embedding_bag", "infer", "embedding_bag"),
        ("official (CUDA op)", "train", None),
        ("detr_peg triton", "train", "triton"),
        ("detr_peg embedding_bag", "train", "embedding_bag"),
    ]
    assert MODELS.get("deformable_detr").attention.compared_on_gpu == ("triton", "embedding_bag")
    for case in cases:
        assert (case.device, case.amp, case.compile, case.batch) == ("cuda", "bf16", True, 4)
        assert (case.height, case.width) == SIZES[case.mode]
    official = cases[0]
    assert (official.impl, official.config, official.overrides) == ("official", None, ["--two_stage"])
    assert all(c.impl == "detr_peg" and c.config == "configs/demo.yaml" for c in cases if c.label != official.label)


def test_detr_plan_has_one_detr_peg_row_per_mode():
    cases = plan_gpu_cases(_base("detr"), modes=["train"], sizes=SIZES, official_repo=None, official_args=[])
    assert [(c.label, c.attention_impl, c.device) for c in cases] == [("detr_peg", None, "cuda")]


def test_throughput_is_images_per_second_relative_to_the_first_row():
    rows = [
        {"label": "official (CUDA op)", "mode": "train", "batch": 4, "height": 512, "width": 512, "seconds": 0.5},
        {"label": "detr_peg triton", "mode": "train", "batch": 4, "height": 512, "width": 512, "seconds": 0.25},
        {"label": "official (CUDA op)", "mode": "infer", "batch": 2, "height": 800, "width": 1066, "seconds": 0.1},
    ]
    add_throughput(rows)
    assert [r["images_per_s"] for r in rows] == [8.0, 16.0, 20.0]
    lines = format_throughput(rows).splitlines()
    assert lines[0] == "images/s (bf16 autocast, torch.compile):"
    assert lines[1].split() == ["case", "mode", "input", "images/s", "x", "first", "row"]
    assert lines[3].split() == ["official", "(CUDA", "op)", "training", "4x512x512", "8.0", "1.00x"]
    assert lines[4].split() == ["detr_peg", "triton", "training", "4x512x512", "16.0", "2.00x"]
    assert lines[5].split() == ["official", "(CUDA", "op)", "inference", "2x800x1066", "20.0", "1.00x"]


def test_worker_sets_the_attention_impl_of_every_layer():
    case = Case(
        label="x",
        impl="detr_peg",
        mode="infer",
        arch="deformable_detr",
        config="configs/demo.yaml",
        overrides=["model.num_classes=4"],
        attention_impl="grid_sample",
    )
    model = _build(case, torch.device("cpu")).model
    layers = [m for m in model.modules() if isinstance(m, MSDeformAttn)]
    assert layers and {m.impl for m in layers} == {"grid_sample"}


OFFICIAL_CUDA_SNIPPET = """#include <vector>
#include "cuda/ms_deform_im2col_cuda.cuh"
#include <THC/THCAtomics.cuh>
    AT_ASSERTM(value.type().is_cuda(), "value must be a CUDA tensor");
        AT_DISPATCH_FLOATING_TYPES(value.type(), "ms_deform_attn_forward_cuda", ([&] {
                value.data<scalar_t>() + n * im2col_step_ * per_value_size,
                spatial_shapes.data<int64_t>(),
"""


def test_official_sources_get_the_edits_for_current_pytorch(tmp_path):
    src = tmp_path / "repo" / "models" / "ops" / "src"
    (src / "cuda").mkdir(parents=True)
    (src / "cpu").mkdir()
    (src / "vision.cpp").write_text('#include "ms_deform_attn.h"\n')
    (src / "ms_deform_attn.h").write_text("if (value.type().is_cuda())\n")
    (src / "cpu" / "ms_deform_attn_cpu.cpp").write_text('AT_ERROR("Not implement on cpu");\n')
    (src / "cuda" / "ms_deform_attn_cuda.cu").write_text(OFFICIAL_CUDA_SNIPPET)
    out = tmp_path / "build" / "src"
    sources = patched_sources(tmp_path / "repo", out)
    assert sources == [
        out / "cpu" / "ms_deform_attn_cpu.cpp",
        out / "cuda" / "ms_deform_attn_cuda.cu",
        out / "vision.cpp",
    ]
    assert (
        (out / "cuda" / "ms_deform_attn_cuda.cu").read_text()
        == """#include <vector>
#include "cuda/ms_deform_im2col_cuda.cuh"
#include <ATen/cuda/Atomic.cuh>
    AT_ASSERTM(value.is_cuda(), "value must be a CUDA tensor");
        AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "ms_deform_attn_forward_cuda", ([&] {
                value.data_ptr<scalar_t>() + n * im2col_step_ * per_value_size,
                spatial_shapes.data_ptr<int64_t>(),
"""
    )
    assert (out / "ms_deform_attn.h").read_text() == "if (value.is_cuda())\n"
    assert (out / "vision.cpp").read_text() == '#include "ms_deform_attn.h"\n'
    # A second preparation leaves unchanged files alone, so that the cached build is reused.
    stamp = (out / "vision.cpp").stat().st_mtime_ns
    os.utime(out / "vision.cpp", ns=(stamp - 10**9, stamp - 10**9))
    patched_sources(tmp_path / "repo", out)
    assert (out / "vision.cpp").stat().st_mtime_ns == stamp - 10**9


def test_official_sources_missing_is_a_config_error(tmp_path):
    from detr_peg.errors import ConfigError

    with pytest.raises(ConfigError, match="has no models/ops/src/vision.cpp"):
        patched_sources(tmp_path, tmp_path / "build")


def test_official_op_runs_in_float32_under_autocast():
    seen = []

    class FakeOfficialFunction:
        @staticmethod
        def apply(value, shapes, start, locations, weights, im2col_step):
            seen.append((value.dtype, shapes.dtype, locations.dtype, weights.dtype, im2col_step))
            return value.flatten(2)

    value = torch.randn(1, 5, 2, 4, dtype=torch.bfloat16)
    out = float32_function(FakeOfficialFunction).apply(
        value,
        torch.tensor([[1, 5]]),
        torch.tensor([0]),
        torch.rand(1, 3, 2, 1, 2, 2, dtype=torch.bfloat16),
        torch.rand(1, 3, 2, 1, 2, dtype=torch.bfloat16),
        64,
    )
    assert seen == [(torch.float32, torch.int64, torch.float32, torch.float32, 64)]
    torch.testing.assert_close(out, value.float().flatten(2))


@pytest.mark.parametrize("arch", [name for name in MODELS.names() if MODELS.get(name).official is not None])
def test_official_builders_take_the_arguments_build_official_passes(arch):
    # build_official calls official.build(path, argv, cuda_op) positionally (OfficialCode.build's contract);
    # Deformable-DETR's builder once took cuda_op by keyword only, and bench --gpu --official failed on a GPU.
    build = MODELS.get(arch).official.build
    inspect.signature(build).bind("../official-checkout", ["--lr", "1e-4"], True)
