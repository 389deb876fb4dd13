"""The Triton deformable attention (``impl="triton"``) against the pure-PyTorch path.

Without a GPU the kernels run in Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``), which Triton reads when the kernels are defined: the
interpreter runs happen in one child process (``triton_interpreter_run``) for
all cases, and this process compares its outputs and the gradients of value,
sampling locations and attention weights with ``impl="embedding_bag"`` on the
same inputs. Shapes are tiny because the interpreter is slow. The CUDA test
runs the compiled kernels where a GPU is present.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.ms_deform_attn_function import ms_deform_attn
from tests.conftest import REPO_ROOT, python_env
from tests.models.deformable.test_ms_deform_attn import SHAPES, level_start, make_inputs
from tests.models.deformable.triton_interpreter_run import run

triton = pytest.importorskip("triton", reason="the triton package is not installed (impl='triton' needs it)")

GRADIENTS = ("value", "sampling_locations", "attention_weights")  # what run() returns besides "output"


def _case(value, shapes, start, loc, weights, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    b, lq, m = loc.shape[:3]
    grad_output = torch.randn(b, lq, m * value.shape[-1], generator=g, dtype=value.dtype)
    return {
        "value": value,
        "spatial_shapes": shapes,
        "level_start_index": start,
        "sampling_locations": loc,
        "attention_weights": weights,
        "grad_output": grad_output,
    }


def _crowded_case(dtype: torch.dtype) -> dict:
    """More queries than one program's block (64 forward, 32 backward), a head_dim that is not a power
    of two, and half of the queries sampling the same pixels (value gradients collide in the atomic adds)."""
    shapes = torch.tensor([(5, 3), (3, 7)])
    g = torch.Generator().manual_seed(11)
    b, lq, m, d, p = 1, 70, 2, 5, 2
    value = torch.randn(b, 15 + 21, m, d, generator=g, dtype=dtype)
    loc = torch.rand(b, lq, m, 2, p, 2, generator=g, dtype=dtype) * 1.2 - 0.1
    loc[:, ::2] = torch.tensor([0.45, 0.6], dtype=dtype)
    weights = torch.rand(b, lq, m, 2, p, generator=g, dtype=dtype)
    return _case(value, shapes, level_start(shapes), loc, weights, seed=12)


def _levels_case() -> dict:
    """Four levels with odd sizes and a single pixel; points on the borders, far outside, on exact pixel
    centers (see make_inputs) and on pixel centers of odd-sized levels, where the pixel coordinate must be
    rounded as grid_sample does for floor() to pick the same cell (this decides the location gradient)."""
    value, shapes, start, loc, weights = make_inputs(torch.float32, seed=1)
    p = loc.shape[4]
    for level, (h, w) in enumerate(SHAPES):
        loc[1, 2, :, level, :, 0] = (torch.arange(p, dtype=torch.float32) % w + 0.5) / w
        loc[1, 2, :, level, :, 1] = (torch.arange(p, dtype=torch.float32) % h + 0.5) / h
    return _case(value, shapes, start, loc, weights, seed=2)


CASES = {
    "levels_float32": _levels_case,
    "crowded_float32": lambda: _crowded_case(torch.float32),
    "levels_float64": lambda: _case(*make_inputs(torch.float64, seed=3), seed=4),
}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """``{case name: (inputs, results of impl="triton" in the interpreter)}``, from one child process."""
    directory = tmp_path_factory.mktemp("triton_interpreter")
    cases = {name: make() for name, make in CASES.items()}
    torch.save(list(cases.values()), directory / "cases.pt")
    env = python_env(TRITON_INTERPRET="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.models.deformable.triton_interpreter_run",
            str(directory / "cases.pt"),
            str(directory / "results.pt"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = torch.load(directory / "results.pt")
    return {name: (case, result) for (name, case), result in zip(cases.items(), results)}


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_pure_path(interpreted, name):
    case, got = interpreted[name]
    want = run(case, impl="embedding_bag")
    # Location gradients are sums of products scaled by the level size: a few float32 ulps of their magnitude.
    tolerance = {} if case["value"].dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    for key in ("output", *GRADIENTS):
        assert got[key].dtype == case["value"].dtype and got[key].shape == want[key].shape, key
        torch.testing.assert_close(got[key], want[key], **tolerance, msg=lambda m, key=key: f"{key}: {m}")


def test_crowded_case_really_collides(interpreted):
    """The shared pixel receives the value gradient of many queries (what the atomic adds must sum)."""
    case, got = interpreted["crowded_float32"]
    assert case["sampling_locations"][:, ::2].unique().numel() == 2
    assert got["value"].abs().amax() > 5 * got["value"].abs().median()


def test_cpu_tensors_need_cuda_outside_the_interpreter():
    from triton.runtime.interpreter import InterpretedFunction

    from detr_peg.models.deformable import ms_deform_attn_triton

    if isinstance(ms_deform_attn_triton._forward_kernel, InterpretedFunction):
        pytest.skip("TRITON_INTERPRET=1 is set for the whole session: the kernels run on the CPU")
    value, shapes, start, loc, weights = make_inputs(torch.float32)
    with pytest.raises(ValueError, match="impl='triton' runs on CUDA tensors, got tensors on cpu"):
        ms_deform_attn(value, shapes, start, loc, weights, impl="triton")


def test_missing_triton_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # "import triton" raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "detr_peg.models.deformable.ms_deform_attn_triton", raising=False)
    value, shapes, start, loc, weights = make_inputs(torch.float32)
    with pytest.raises(RuntimeError, match="impl='triton' needs the triton package"):
        ms_deform_attn(value, shapes, start, loc, weights, impl="triton")


def test_module_accepts_the_triton_impl():
    module = MSDeformAttn(d_model=16, n_levels=2, n_heads=2, n_points=2, impl="triton")
    assert module.impl == "triton" and "impl='triton'" in module.extra_repr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_pure_path(dtype):
    case = {k: v.cuda() for k, v in _crowded_case(torch.float32).items()}
    low = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in case.items()}
    # The reference sees the same rounded inputs in float32: a location rounded to bfloat16 can cross a pixel
    # edge, where the gradient with respect to it jumps, so only the kernel's own arithmetic is compared.
    want = run({k: (v.float() if v.is_floating_point() else v) for k, v in low.items()}, impl="embedding_bag")
    got = run(low, impl="triton")
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    for key in ("output", *GRADIENTS):
        assert got[key].dtype == dtype
        torch.testing.assert_close(got[key].float(), want[key], **tolerance)


def test_kernels_compile_for_a_gpu_without_one():
    """The interpreter does not check what only the compiler does (types, constexpr branches): compile both
    kernels for an H100 (sm_90) ahead of time, which needs Triton's bundled ptxas but no GPU."""
    from triton.runtime.interpreter import InterpretedFunction

    from detr_peg.models.deformable import ms_deform_attn_triton as kernels

    if isinstance(kernels._forward_kernel, InterpretedFunction):
        pytest.skip("TRITON_INTERPRET=1 is set for the whole session: the kernels are interpreted")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as error:
        pytest.skip(f"this triton has no ahead-of-time compile API ({error})")
    constants = {
        "N_HEADS": 8,
        "HEAD_DIM": 32,
        "N_LEVELS": 4,
        "N_POINTS": 4,
        "BLOCK_D": 32,
        "COMPUTE": triton.language.float32,
        "COORD_LIMIT": kernels._COORD_LIMIT,
    }
    pointers = {
        kernels._forward_kernel: ["value", "shapes", "start", "loc", "attn", "out"],
        kernels._backward_kernel: [
            "value",
            "shapes",
            "start",
            "loc",
            "attn",
            "grad_out",
            "grad_value",
            "grad_loc",
            "grad_attn",
        ],
    }
    blocks = {kernels._forward_kernel: kernels._FORWARD_BLOCK_Q, kernels._backward_kernel: kernels._BACKWARD_BLOCK_Q}
    for kernel, names in pointers.items():
        # bfloat16 tensors as under autocast; int64 shapes; the value gradient accumulates in float32.
        signature = {
            f"{n}_ptr": "*i64" if n in ("shapes", "start") else "*fp32" if n == "grad_value" else "*bf16" for n in names
        }
        signature.update(num_queries="i32", num_values="i32")
        consts = {**constants, "BLOCK_Q": blocks[kernel]}
        signature.update(dict.fromkeys(consts, "constexpr"))
        try:
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32)
            )
        except RuntimeError as error:
            if "ptxas" in str(error).lower():
                pytest.skip(f"Triton's ptxas is not usable here ({error})")
            raise
        assert ".visible .entry" in compiled.asm["ptx"]
