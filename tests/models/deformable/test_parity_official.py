"""Deformable-DETR with ``sine`` reproduces the official Deformable-DETR.

Both fixtures of shared/reference are checked: ``deformable_detr_r18``
(single-stage, d = 64) and ``deformable_detr_r18_refine_twostage`` (iterative
box refinement and two-stage proposals, d = 256). The fixture weights are
written as an official training checkpoint, converted with ``detr-peg
convert`` and loaded with ``detr_peg.load_model``. Outputs, auxiliary and
encoder outputs, every intermediate, every loss term, the matcher indices, the
post-processed results and every stored gradient must match at rtol 1e-4,
atol 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch

from detr_peg import build_criterion, build_postprocessor, load_model
from detr_peg.cli.main import main
from detr_peg.convert.deformable import DEFORMABLE_KEY_MAP
from tests.parity import (
    assert_close,
    assert_feature_close,
    assert_gradients_match,
    assert_losses_and_indices_match,
    assert_outputs_match,
    assert_postprocessed_match,
    load_fixture,
    nested_output,
    targets_from_fixture,
    write_official_checkpoint,
)

SINGLE_STAGE = "deformable_detr_r18"
REFINE_TWO_STAGE = "deformable_detr_r18_refine_twostage"


def _capture(model) -> dict:
    """Forward hooks that collect the tensors the official fixtures store as intermediates."""
    captured: dict = {}
    backbone_levels = len(model.backbone.out_channels)
    calls = []  # positional encoding calls, one per level in order

    def features(module, inputs, output):
        captured.update({f"backbone.feat{l}": f for l, f in enumerate(output)})

    def position(module, inputs, output):
        level = len(calls)
        calls.append(level)
        prefix = "backbone" if level < backbone_levels else "extra_level"
        captured[f"{prefix}.mask{level}"] = inputs[0]
        captured[f"{prefix}.pos{level}"] = output

    def projection(level):
        return lambda module, inputs, output: captured.update({f"input_proj{level}": output})

    def transformer(module, inputs, output):
        layout = output.layout
        captured.update(
            {
                "encoder.spatial_shapes": layout.spatial_shapes,
                "encoder.level_start_index": layout.level_start_index,
                "encoder.mask_flatten": layout.mask,
                "encoder.valid_ratios": layout.valid_ratios,
                "encoder.memory": output.memory,
                "transformer.hs": output.hs,
                "transformer.init_reference": output.init_reference,
                "transformer.inter_references": output.inter_references,
            }
        )
        if output.enc_outputs_coord_unact is not None:
            captured["transformer.enc_outputs_coord_unact"] = output.enc_outputs_coord_unact

    model.backbone.register_forward_hook(features)
    model.transformer.position.register_forward_hook(position)
    for level, proj in enumerate(model.input_proj):
        proj.register_forward_hook(projection(level))
    model.transformer.register_forward_hook(transformer)
    return captured


@pytest.fixture(scope="module", params=[SINGLE_STAGE, REFINE_TWO_STAGE])
def run(request, tmp_path_factory, reference_dir):
    fixture = request.param
    folder = tmp_path_factory.mktemp(fixture)
    src, dst = folder / "official.pth", folder / "converted.pth"
    write_official_checkpoint(reference_dir, fixture, src)
    assert main(["convert", str(src), str(dst)]) == 0
    loaded = load_model(dst)
    model = loaded.model
    captured = _capture(model)

    inputs = load_fixture(reference_dir, fixture, "inputs")
    outputs = model(inputs["images_padded"], inputs["mask"])
    criterion = build_criterion(loaded.config)
    targets = targets_from_fixture(load_fixture(reference_dir, fixture, "targets"))
    losses, indices = criterion(outputs, targets, return_indices=True)
    total = criterion.weighted_total(losses)
    total.backward()
    results = build_postprocessor(loaded.config)(outputs, inputs["orig_target_sizes"])
    return dict(
        fixture=fixture,
        model=model,
        config=loaded.config,
        outputs=outputs,
        captured=captured,
        losses=losses,
        indices=indices,
        total=total,
        results=results,
        reference_dir=reference_dir,
        src=src,
    )


def _expected(run, name):
    return load_fixture(run["reference_dir"], run["fixture"], name)


def test_converted_configuration(run):
    cfg = run["config"]
    two_stage = run["fixture"] == REFINE_TWO_STAGE
    assert cfg.model.arch == "deformable_detr"
    assert cfg.model.with_box_refine is two_stage and cfg.model.two_stage is two_stage
    assert cfg.model.transformer.num_feature_levels == 4
    assert (cfg.model.transformer.enc_n_points, cfg.model.transformer.dec_n_points) == (4, 4)
    assert run["model"].num_queries == 10 and cfg.model.num_classes == 91


def test_outputs_aux_outputs_and_encoder_outputs(run):
    expected = _expected(run, "outputs")
    outputs = run["outputs"]
    assert len(outputs["aux_outputs"]) == 1
    assert ("enc_outputs" in outputs) == (run["fixture"] == REFINE_TWO_STAGE)
    assert {k for k in expected if k.startswith("enc_outputs.")} == (
        {f"enc_outputs.{k}" for k in outputs["enc_outputs"]} if "enc_outputs" in outputs else set()
    )
    for name, tensor in expected.items():
        actual = nested_output(outputs, name)
        assert_close(actual, tensor, name)
        if name == "enc_outputs.pred_boxes":
            # Padded and invalid proposals are exactly 1.0, as in the official code.
            ones = tensor == 1.0
            assert ones.sum() >= 1416
            assert torch.equal(actual[ones], tensor[ones])


def test_intermediates(run):
    expected = _expected(run, "intermediates")
    captured = run["captured"]
    assert set(expected) == set(captured)
    for name, tensor in expected.items():
        actual = captured[name]
        if tensor.dtype in (torch.bool, torch.int64):
            assert actual.dtype == tensor.dtype, name
            assert torch.equal(actual, tensor), name
        elif name == "transformer.enc_outputs_coord_unact":
            inf = torch.isinf(tensor)
            assert int(inf.sum()) == 1416
            assert torch.equal(torch.isinf(actual), inf) and (actual[inf] > 0).all(), name
            assert_close(actual[~inf], tensor[~inf], name)
        else:
            assert_feature_close(actual, tensor, name)


def test_losses_and_matcher_indices(run):
    expected = _expected(run, "losses")
    stages = {"final", "aux0"} | ({"enc"} if run["fixture"] == REFINE_TWO_STAGE else set())
    assert set(run["indices"]) == stages
    checked = assert_losses_and_indices_match(run["losses"], run["indices"], run["total"], expected)
    assert checked == (26 if run["fixture"] == REFINE_TWO_STAGE else 18)
    assert set(run["losses"]) == {k for k in expected if not k.startswith("indices.") and k != "total_weighted"}


def test_postprocessed_results(run):
    expected = _expected(run, "postprocess")
    assert len(run["results"]) == 2
    assert_postprocessed_match(run["results"], expected)


def test_gradients(run, reference_dir):
    expected = _expected(run, "grads_nonbackbone")
    params = dict(run["model"].named_parameters())
    ours = {n for n, p in params.items() if not n.startswith("backbone.") and p.requires_grad}
    mapped = {DEFORMABLE_KEY_MAP(k) for k in expected}
    assert len(mapped) == len(expected)
    if run["fixture"] == SINGLE_STAGE:
        assert mapped == ours  # every non-backbone parameter is stored
    else:
        meta = json.loads((reference_dir / run["fixture"] / "meta.json").read_text())
        omitted = {DEFORMABLE_KEY_MAP(k) for k in meta["grads"]["omitted_params"]}
        assert mapped | omitted == ours and not mapped & omitted
    assert_gradients_match(run["model"], expected, DEFORMABLE_KEY_MAP)


def test_channels_last_backbone_keeps_outputs_losses_and_gradients(run, tmp_path):
    """``model.backbone.memory_format=channels_last`` (the R50 configs' setting) stays within parity tolerance."""
    dst = tmp_path / "channels_last.pth"
    assert main(["convert", str(run["src"]), str(dst), "model.backbone.memory_format=channels_last"]) == 0
    loaded = load_model(dst)
    model = loaded.model
    assert model.backbone.memory_format == torch.channels_last
    inputs = _expected(run, "inputs")
    outputs = model(inputs["images_padded"], inputs["mask"])
    assert_outputs_match(outputs, _expected(run, "outputs"))
    criterion = build_criterion(loaded.config)
    total = criterion.weighted_total(criterion(outputs, targets_from_fixture(_expected(run, "targets"))))
    assert_close(total.detach(), _expected(run, "losses")["total_weighted"], "total")
    total.backward()
    assert_gradients_match(model, _expected(run, "grads_nonbackbone"), DEFORMABLE_KEY_MAP)
