"""``detr-peg convert`` reads the three official Deformable-DETR layouts.

Single-stage and refine + two-stage come from the official fixtures
(shared/reference); the refine-only layout is written from a small detr_peg
model renamed to the official keys, with the official alias keys added.
"""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from detr_peg import load_model
from detr_peg.cli.main import main
from detr_peg.convert.deformable import DEFORMABLE_KEY_MAP
from tests.models.deformable.small_model import images_of_different_sizes, small_model
from tests.parity import assert_close, load_fixture, official_state_dict, write_official_checkpoint

SINGLE_STAGE = "deformable_detr_r18"
REFINE_TWO_STAGE = "deformable_detr_r18_refine_twostage"

PEG_KEYS = (
    "norm.bias",
    "norm.num_batches_tracked",
    "norm.running_mean",
    "norm.running_var",
    "norm.weight",
    "proj.weight",
)


def _to_official(state: dict[str, torch.Tensor], two_stage: bool) -> dict[str, torch.Tensor]:
    """detr_peg keys -> official keys, with the aliases the official checkpoints store."""
    official = {}
    for key, value in state.items():
        key = re.sub(r"^backbone\.body\.", "backbone.0.body.", key)
        key = re.sub(r"^input_proj\.(\d+)\.conv\.", r"input_proj.\1.0.", key)
        key = re.sub(r"^input_proj\.(\d+)\.norm\.", r"input_proj.\1.1.", key)
        official[key] = value.clone()
        if key.startswith("bbox_embed.") or (two_stage and key.startswith("class_embed.")):
            official[f"transformer.decoder.{key}"] = value.clone()
    return official


def _convert(tmp_path, src, *overrides, name="out.pth"):
    dst = tmp_path / name
    status = main(["convert", str(src), str(dst), *overrides])
    return status, dst


@pytest.mark.parametrize("fixture", [SINGLE_STAGE, REFINE_TWO_STAGE])
def test_fixture_layouts_convert_with_a_complete_report(fixture, reference_dir, tmp_path, capsys):
    src = tmp_path / "official.pth"
    write_official_checkpoint(reference_dir, fixture, src)
    status, dst = _convert(tmp_path, src)
    assert status == 0
    printed = capsys.readouterr().out
    assert "Converted Deformable-DETR checkpoint" in printed
    assert "new keys (initialised fresh): 0 none" in printed
    assert "unused keys: 0 none" in printed
    if fixture == REFINE_TWO_STAGE:
        assert "alias keys of shared modules (identical, stored once): 24" in printed
    else:
        assert "alias keys" not in printed
    loaded = load_model(dst)
    model = loaded.model
    two_stage = fixture == REFINE_TWO_STAGE
    assert (loaded.config.model.with_box_refine, loaded.config.model.two_stage) == (two_stage, two_stage)
    assert loaded.config.data.contiguous_labels is False
    # every official weight arrives under its mapped name
    official, _ = official_state_dict(reference_dir, fixture)
    ours = model.state_dict()
    for key, value in official.items():
        assert torch.equal(ours[DEFORMABLE_KEY_MAP(key)], value), key


def test_refine_only_layout(tmp_path, capsys):
    model = small_model("model.with_box_refine=true", seed=3).eval()
    with torch.no_grad():  # make the heads differ from their initialisation
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    official = _to_official(model.state_dict(), two_stage=False)
    assert any(k.startswith("transformer.decoder.bbox_embed.") for k in official)
    assert not any(k.startswith("transformer.decoder.class_embed.") for k in official)
    src = tmp_path / "refine.pth"
    args = argparse.Namespace(nheads=2, enc_n_points=2, dec_n_points=2, lr_backbone=2e-5, position_embedding="sine")
    torch.save({"model": official, "args": args}, src)
    status, dst = _convert(tmp_path, src)
    assert status == 0
    printed = capsys.readouterr().out
    assert "new keys (initialised fresh): 0 none" in printed and "unused keys: 0 none" in printed
    assert "alias keys of shared modules (identical, stored once): 12" in printed
    converted = load_model(dst)
    cfg = converted.config.model
    assert cfg.with_box_refine and not cfg.two_stage
    assert (cfg.transformer.num_feature_levels, cfg.transformer.enc_n_points, cfg.num_queries) == (4, 2, 6)
    for key, value in model.state_dict().items():
        assert torch.equal(converted.model.state_dict()[key], value), key
    images = images_of_different_sizes()
    with torch.no_grad():
        torch.testing.assert_close(converted.model(images)["pred_boxes"], model(images)["pred_boxes"], rtol=0, atol=0)


def test_differing_alias_copies_are_refused(tmp_path, capsys):
    model = small_model("model.with_box_refine=true")
    official = _to_official(model.state_dict(), two_stage=False)
    official["transformer.decoder.bbox_embed.0.layers.0.bias"] += 1.0
    src = tmp_path / "broken.pth"
    torch.save({"model": official}, src)
    status, _ = _convert(tmp_path, src, "model.transformer.nheads=2")
    assert status == 2
    assert "should be copies of one shared module" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [("query_embed.weight", "has no 'query_embed.weight', which every Deformable-DETR checkpoint has"),
     ("class_embed.0.weight", "has no 'class_embed.0.weight', which every"),
     ("transformer.encoder.layers.0.linear1.weight", "has no 'transformer.encoder.layers.0.linear1.weight'"),
     ("args", "'args' is a list, not the official code's options")],
)  # fmt: skip
def test_a_damaged_official_checkpoint_is_one_sentence(tmp_path, capsys, damage: str, fragment: str) -> None:
    """A tensor the layout inference reads, or stored options of another kind: refused, nothing written."""
    official = _to_official(small_model("model.with_box_refine=true").state_dict(), two_stage=False)
    stored = {"model": official, "args": ["not", "a", "namespace"] if damage == "args" else None}
    official.pop(damage, None)
    torch.save(stored, tmp_path / "damaged.pth")
    status, dst = _convert(tmp_path, tmp_path / "damaged.pth", "model.transformer.nheads=2")
    err = capsys.readouterr().err.strip()
    assert status == 2 and fragment in err and "\n" not in err and not dst.exists()


def test_convert_to_peg_keeps_every_shared_weight(reference_dir, tmp_path, capsys):
    src = tmp_path / "official.pth"
    write_official_checkpoint(reference_dir, SINGLE_STAGE, src)
    _, sine_dst = _convert(tmp_path, src, name="sine.pth")
    capsys.readouterr()
    status, peg_dst = _convert(tmp_path, src, "model.position.name=peg", name="peg.pth")
    assert status == 0
    printed = capsys.readouterr().out
    sine_state, peg_state = load_model(sine_dst).model.state_dict(), load_model(peg_dst).model.state_dict()
    new = sorted(set(peg_state) - set(sine_state))
    assert new == sorted(f"transformer.position.pegs.layer0.level{l}.{k}" for l in range(4) for k in PEG_KEYS)
    assert set(sine_state) <= set(peg_state)
    for key, value in sine_state.items():
        assert torch.equal(peg_state[key], value), key
    assert "new keys (initialised fresh): 20" in printed and "unused keys: 0 none" in printed
    for key in new:
        if not key.endswith("num_batches_tracked"):
            assert key in printed


def test_two_stage_peg_conversion_reports_only_peg_keys(reference_dir, tmp_path, capsys):
    src = tmp_path / "official.pth"
    write_official_checkpoint(reference_dir, REFINE_TWO_STAGE, src)
    status, dst = _convert(tmp_path, src, "model.position.name=peg", "model.position.peg_layers=[0,1]")
    assert status == 0
    printed = capsys.readouterr().out
    assert "new keys (initialised fresh): 40" in printed and "unused keys: 0 none" in printed
    assert "alias keys of shared modules (identical, stored once): 24" in printed
    cfg = load_model(dst).config.model
    assert cfg.position.peg_layers == [0, 1] and cfg.two_stage and cfg.with_box_refine


def test_heads_and_proposals_come_from_overrides_without_args(reference_dir, tmp_path, capsys):
    inputs = load_fixture(reference_dir, SINGLE_STAGE, "inputs")
    expected = load_fixture(reference_dir, SINGLE_STAGE, "outputs")["pred_logits"]
    src = tmp_path / "bare.pth"
    write_official_checkpoint(reference_dir, SINGLE_STAGE, src, with_args=False)

    status, dst = _convert(tmp_path, src, "model.transformer.nheads=4", name="h4.pth")
    assert status == 0
    loaded = load_model(dst)
    model = loaded.model
    assert (loaded.config.model.transformer.enc_n_points, loaded.config.model.transformer.dec_n_points) == (4, 4)
    with torch.no_grad():
        assert_close(model(inputs["images_padded"], inputs["mask"])["pred_logits"], expected, "nheads=4")

    # Without args the heads are not taken from the defaults (8 would fit the weights with 2 points each: another
    # model); 8 given explicitly is such a model.
    capsys.readouterr()
    status, dst = _convert(tmp_path, src, name="h_default.pth")
    assert status == 2 and not dst.exists()
    assert "stores no 'args', and its weights do not tell model.transformer.nheads; give it" in capsys.readouterr().err
    status, dst = _convert(tmp_path, src, "model.transformer.nheads=8", name="h8.pth")
    assert status == 0
    model8 = load_model(dst)
    assert (model8.config.model.transformer.nheads, model8.config.model.transformer.enc_n_points) == (8, 2)

    # 32 heads do not fit 128 sampling offsets over 4 levels: a clear error
    capsys.readouterr()
    status, dst = _convert(tmp_path, src, "model.transformer.nheads=32", name="h32.pth")
    assert status == 2 and not dst.exists()
    err = capsys.readouterr().err
    assert "model.transformer.nheads=32" in err and "sampling offsets" in err

    # a sampling-point override that contradicts the weights is refused
    status, dst = _convert(
        tmp_path, src, "model.transformer.nheads=4", "model.transformer.enc_n_points=2", name="p2.pth"
    )
    assert status == 2 and not dst.exists()
    assert "model.transformer.enc_n_points=2" in capsys.readouterr().err

    two_stage = tmp_path / "bare_two_stage.pth"
    write_official_checkpoint(reference_dir, REFINE_TWO_STAGE, two_stage, with_args=False)
    capsys.readouterr()
    status, dst = _convert(tmp_path, two_stage, "model.transformer.nheads=8", name="ts_default.pth")
    assert status == 2 and not dst.exists()
    assert "do not tell model.transformer.two_stage_num_proposals; give it" in capsys.readouterr().err
    status, dst = _convert(
        tmp_path, two_stage, "model.transformer.nheads=8", "model.transformer.two_stage_num_proposals=10", name="ts.pth"
    )
    assert status == 0
    loaded = load_model(dst)
    model = loaded.model
    # the rest of the configuration equals the fixture's, whose outputs the parity test checks
    assert loaded.config.model.transformer.nheads == 8 and model.num_queries == 10
    assert loaded.config.model.transformer.enc_n_points == 4 and loaded.config.model.two_stage


def test_override_contradicting_the_layout_is_refused(reference_dir, tmp_path, capsys):
    src = tmp_path / "official.pth"
    write_official_checkpoint(reference_dir, REFINE_TWO_STAGE, src)
    status, dst = _convert(tmp_path, src, "model.two_stage=false")
    assert status == 2 and not dst.exists()
    err = capsys.readouterr().err
    assert "model.two_stage=False" in err and "contradicts the weights" in err
