"""DETR with ``sine`` reproduces the official DETR (fixtures in shared/reference/detr_r18).

The fixture weights are written as an official training checkpoint, converted
with ``detr-peg convert`` and loaded with ``detr_peg.load_model``. Outputs,
auxiliary outputs, intermediates, losses, matcher indices, post-processed
results and non-backbone gradients must match at rtol 1e-4, atol 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from detr_peg import build_criterion, build_postprocessor, load_model
from detr_peg.cli.main import main
from detr_peg.convert.detr import DETR_KEY_MAP
from tests.conftest import CLI, run_python
from tests.parity import (
    assert_close,
    assert_feature_close,
    assert_gradients_match,
    assert_losses_and_indices_match,
    assert_outputs_match,
    assert_postprocessed_match,
    load_fixture,
    targets_from_fixture,
    write_official_checkpoint,
)

FIXTURE = "detr_r18"


@pytest.fixture(scope="module")
def run(tmp_path_factory, reference_dir):
    folder = tmp_path_factory.mktemp("detr_parity")
    src, dst = folder / "official.pth", folder / "converted.pth"
    write_official_checkpoint(reference_dir, FIXTURE, src)
    assert main(["convert", str(src), str(dst)]) == 0
    loaded = load_model(dst)
    model = loaded.model

    captured = {}

    def keep(name, fn):
        return lambda module, inputs, output: captured.update({name: fn(inputs, output)})

    model.backbone.register_forward_hook(keep("backbone.feat0", lambda i, o: o[-1]))
    model.input_proj.register_forward_hook(keep("input_proj", lambda i, o: o))
    model.transformer.position.register_forward_hook(keep("backbone.pos0", lambda i, o: o))
    model.transformer.position.register_forward_hook(keep("backbone.mask0", lambda i, o: i[0]))
    model.transformer.register_forward_hook(keep("transformer.hs", lambda i, o: o[0]))
    model.transformer.register_forward_hook(keep("transformer.memory", lambda i, o: o[1]))

    inputs = load_fixture(reference_dir, FIXTURE, "inputs")
    outputs = model(inputs["images_padded"], inputs["mask"])
    criterion = build_criterion(loaded.config)
    targets = targets_from_fixture(load_fixture(reference_dir, FIXTURE, "targets"))
    losses, indices = criterion(outputs, targets, return_indices=True)
    total = criterion.weighted_total(losses)
    total.backward()
    results = build_postprocessor(loaded.config)(outputs, inputs["orig_target_sizes"])
    return dict(
        model=model,
        outputs=outputs,
        captured=captured,
        losses=losses,
        indices=indices,
        total=total,
        results=results,
        reference_dir=reference_dir,
        src=src,
        folder=folder,
    )


def test_outputs_and_aux_outputs(run):
    expected = load_fixture(run["reference_dir"], FIXTURE, "outputs")
    assert len(run["outputs"]["aux_outputs"]) == 1
    assert_outputs_match(run["outputs"], expected)


def test_intermediates(run):
    expected = load_fixture(run["reference_dir"], FIXTURE, "intermediates")
    assert set(expected) == set(run["captured"])
    for name, tensor in expected.items():
        if tensor.dtype == torch.bool:
            assert torch.equal(run["captured"][name], tensor), name
        else:
            assert_feature_close(run["captured"][name], tensor, name)


def test_losses_and_matcher_indices(run):
    expected = load_fixture(run["reference_dir"], FIXTURE, "losses")
    assert assert_losses_and_indices_match(run["losses"], run["indices"], run["total"], expected) == 18


def test_postprocessed_results(run):
    assert_postprocessed_match(run["results"], load_fixture(run["reference_dir"], FIXTURE, "postprocess"))


def test_non_backbone_gradients(run):
    expected = load_fixture(run["reference_dir"], FIXTURE, "grads_nonbackbone")
    params = dict(run["model"].named_parameters())
    ours = {n for n, p in params.items() if not n.startswith("backbone.") and p.requires_grad}
    assert {DETR_KEY_MAP(k) for k in expected} == ours
    assert_gradients_match(run["model"], expected, DETR_KEY_MAP)


def test_convert_cli_in_a_subprocess(run, tmp_path):
    dst = tmp_path / "out.pth"
    proc = run_python(*CLI, "convert", str(run["src"]), str(dst), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "new keys (initialised fresh): 0" in proc.stdout
    assert "unused keys: 0" in proc.stdout
    converted = load_model(dst).model
    for key, value in run["model"].state_dict().items():
        assert torch.equal(converted.state_dict()[key], value), key


def test_heads_come_from_overrides_when_args_are_absent(run, tmp_path):
    src = tmp_path / "bare.pth"
    write_official_checkpoint(run["reference_dir"], FIXTURE, src, with_args=False)
    inputs = load_fixture(run["reference_dir"], FIXTURE, "inputs")
    expected = load_fixture(run["reference_dir"], FIXTURE, "outputs")["pred_logits"]

    assert main(["convert", str(src), str(tmp_path / "h4.pth"), "model.transformer.nheads=4"]) == 0
    with torch.no_grad():
        got = load_model(tmp_path / "h4.pth").model(inputs["images_padded"], inputs["mask"])["pred_logits"]
    assert_close(got, expected, "pred_logits with nheads=4")

    # Without the override the default of 8 heads gives a different model.
    assert main(["convert", str(src), str(tmp_path / "h8.pth")]) == 0
    loaded8 = load_model(tmp_path / "h8.pth")
    model8 = loaded8.model
    assert loaded8.config.model.transformer.nheads == 8
    with torch.no_grad():
        other = model8(inputs["images_padded"], inputs["mask"])["pred_logits"]
    assert not torch.allclose(other, expected, rtol=1e-4, atol=1e-5)


def test_override_contradicting_weights_is_refused(run, tmp_path, capsys):
    status = main(["convert", str(run["src"]), str(tmp_path / "x.pth"), "model.num_classes=20"])
    assert status == 2
    err = capsys.readouterr().err
    assert "model.num_classes=20" in err and "91" in err
    assert not (tmp_path / "x.pth").exists()


def test_convert_to_peg_keeps_shared_weights_and_reports_new_keys(run, tmp_path, capsys):
    dst = tmp_path / "peg.pth"
    assert main(["convert", str(run["src"]), str(dst), "model.position.name=peg"]) == 0
    printed = capsys.readouterr().out
    peg = load_model(dst).model
    sine_state = run["model"].state_dict()
    peg_state = peg.state_dict()
    new = sorted(set(peg_state) - set(sine_state))
    assert new == [
        "transformer.position.pegs.layer0.level0.norm.bias",
        "transformer.position.pegs.layer0.level0.norm.num_batches_tracked",
        "transformer.position.pegs.layer0.level0.norm.running_mean",
        "transformer.position.pegs.layer0.level0.norm.running_var",
        "transformer.position.pegs.layer0.level0.norm.weight",
        "transformer.position.pegs.layer0.level0.proj.weight",
    ]
    assert set(sine_state) <= set(peg_state)
    for key, value in sine_state.items():
        assert torch.equal(peg_state[key], value), key
    assert "new keys (initialised fresh): 5" in printed
    for key in new:
        if not key.endswith("num_batches_tracked"):
            assert key in printed
    assert "unused keys: 0" in printed


def test_channels_last_backbone_keeps_outputs_losses_and_gradients(run, tmp_path):
    """``model.backbone.memory_format=channels_last`` (the R50 configs' setting) stays within parity tolerance.

    Its backbone features differ from the NCHW ones by float rounding only, so
    the detector's outputs, losses and non-backbone gradients still match the
    official model at rtol 1e-4, atol 1e-5.
    """
    dst = tmp_path / "channels_last.pth"
    assert main(["convert", str(run["src"]), str(dst), "model.backbone.memory_format=channels_last"]) == 0
    loaded = load_model(dst)
    model = loaded.model
    assert model.backbone.memory_format == torch.channels_last
    inputs = load_fixture(run["reference_dir"], FIXTURE, "inputs")
    outputs = model(inputs["images_padded"], inputs["mask"])
    assert_outputs_match(outputs, load_fixture(run["reference_dir"], FIXTURE, "outputs"))
    criterion = build_criterion(loaded.config)
    losses = criterion(outputs, targets_from_fixture(load_fixture(run["reference_dir"], FIXTURE, "targets")))
    total = criterion.weighted_total(losses)
    assert_close(total.detach(), load_fixture(run["reference_dir"], FIXTURE, "losses")["total_weighted"], "total")
    total.backward()
    assert_gradients_match(model, load_fixture(run["reference_dir"], FIXTURE, "grads_nonbackbone"), DETR_KEY_MAP)
