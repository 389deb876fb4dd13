"""Helpers for parity tests against the official-code fixtures in ``shared/reference``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

RTOL, ATOL = 1e-4, 1e-5


def official_state_dict(reference_dir: Path, fixture: str) -> tuple[dict, dict]:
    """The full official state dict of a fixture (shared backbone + the rest) and its meta.json."""
    folder = reference_dir / fixture
    meta = json.loads((folder / "meta.json").read_text())
    prefix = meta["backbone"]["state_dict_prefix"]
    state = {prefix + k: v for k, v in load_file(reference_dir / "backbone_resnet18.safetensors").items()}
    state.update(load_file(folder / "weights.safetensors"))
    assert set(state) == set(meta["state_dict"])
    return state, meta


def write_official_checkpoint(reference_dir: Path, fixture: str, path: Path, with_args: bool = True) -> dict:
    """Write the fixture's weights as the official training script would (``model`` + ``args``)."""
    state, meta = official_state_dict(reference_dir, fixture)
    obj = {"model": state}
    if with_args:
        obj["args"] = argparse.Namespace(**meta["build_args"])
        obj["epoch"] = 0
    torch.save(obj, path)
    return meta


def load_fixture(reference_dir: Path, fixture: str, name: str) -> dict[str, torch.Tensor]:
    return load_file(reference_dir / fixture / f"{name}.safetensors")


def targets_from_fixture(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    count = len({k.split(".")[0] for k in tensors})
    return [{"labels": tensors[f"target{i}.labels"], "boxes": tensors[f"target{i}.boxes"]} for i in range(count)]


def nested_output(outputs: dict, dotted: str) -> torch.Tensor:
    """``aux_outputs.0.pred_logits`` -> ``outputs["aux_outputs"][0]["pred_logits"]``."""
    node = outputs
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def assert_feature_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """An intermediate feature map within tolerance of the fixture, the absolute part scaled by its magnitude.

    Backbone features reach |x| ~ 40 after a dozen convolutions whose float32
    sums oneDNN orders by the CPU's vector width: the fixtures came from an
    AVX-512 machine, and on an AVX2 machine a few of 51,200 values differ by
    up to 5e-5 (about 2e-6 of the map's largest value), which the plain
    ``atol`` of 1e-5 flags wherever such a value is near zero. The outputs,
    losses and gradients keep the plain tolerance.
    """
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL * scale, msg=lambda m: f"{name}: {m}")


def assert_outputs_match(outputs: dict, expected: dict[str, torch.Tensor]) -> None:
    """Every tensor of a fixture's ``outputs`` (dotted names, see :func:`nested_output`) within tolerance."""
    for name, tensor in expected.items():
        assert_close(nested_output(outputs, name), tensor, name)


def assert_losses_and_indices_match(
    losses: dict[str, torch.Tensor], indices: dict, total: torch.Tensor, expected: dict[str, torch.Tensor]
) -> int:
    """A fixture's ``losses``: every loss term and ``total_weighted`` within tolerance, matcher indices exactly.

    Args:
        losses: the criterion's loss terms.
        indices: ``{stage: [(query_index, target_index) per image]}`` as the
            criterion returns them with ``return_indices=True``.
        total: the weighted total.
        expected: names ``loss_*``, ``total_weighted`` and
            ``indices.<stage>.img<i>.query|target``.

    Returns:
        How many entries were checked.
    """
    checked = 0
    for name, tensor in expected.items():
        if name.startswith("indices."):
            _, stage, image, which = name.split(".")
            query, target = indices[stage][int(image[3:])]
            assert torch.equal(query if which == "query" else target, tensor), name
        elif name == "total_weighted":
            assert_close(total.detach(), tensor, name)
        else:
            assert_close(losses[name].detach(), tensor, name)
        checked += 1
    return checked


def assert_postprocessed_match(results: list[dict[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> None:
    """A fixture's ``postprocess`` (``result<i>.<field>``): labels exactly, scores and boxes within tolerance."""
    for name, tensor in expected.items():
        result, field = name.split(".")
        actual = results[int(result.removeprefix("result"))][field]
        if tensor.dtype == torch.int64:
            assert torch.equal(actual, tensor), name
        else:
            assert_close(actual, tensor, name)


def assert_gradients_match(
    model: torch.nn.Module, expected: dict[str, torch.Tensor], key_map: Callable[[str], str]
) -> None:
    """The gradients of ``model``'s parameters against a fixture's, whose official names ``key_map`` translates."""
    params = dict(model.named_parameters())
    for name, grad in expected.items():
        assert_close(params[key_map(name)].grad, grad, f"grad {name}")
