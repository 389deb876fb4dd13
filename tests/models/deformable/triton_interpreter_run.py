"""Runs ``impl="triton"`` forward and backward on saved inputs, for the interpreter tests.

``python -m tests.models.deformable.triton_interpreter_run IN OUT`` loads a
list of cases from ``IN`` (``torch.save``), each a dict with ``value``,
``spatial_shapes``, ``level_start_index``, ``sampling_locations``,
``attention_weights`` and ``grad_output``, and saves to ``OUT`` one dict per
case: ``output`` and the gradients ``value``, ``sampling_locations`` and
``attention_weights``. The test runs it with ``TRITON_INTERPRET=1``, which
Triton reads when the kernels are defined, in its own process so that the rest
of the test session keeps Triton's normal mode.
"""

from __future__ import annotations

import sys

import torch

from detr_peg.models.deformable.ms_deform_attn_function import ms_deform_attn


def run(case: dict, impl: str = "triton") -> dict:
    """Output and gradients of ``ms_deform_attn(..., impl=impl)`` for one case (detached)."""
    inputs = [case[k].clone().requires_grad_(True) for k in ("value", "sampling_locations", "attention_weights")]
    output = ms_deform_attn(
        inputs[0], case["spatial_shapes"], case["level_start_index"], inputs[1], inputs[2], impl=impl
    )
    grads = torch.autograd.grad(output, inputs, case["grad_output"])
    return {"output": output.detach(), "value": grads[0], "sampling_locations": grads[1], "attention_weights": grads[2]}


def main(argv: list[str]) -> int:
    cases = torch.load(argv[0])
    torch.save([run(case) for case in cases], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
