"""``detr-peg convert`` of Transformers folders: the report, the layouts of other versions, refusals, the Hub.

The folders are the small random models of ``transformers_models`` (shared
with the parity tests). Every refusal is one line on stderr naming the
``config.json`` field, with exit status 2.
"""

from __future__ import annotations

import json
import shutil

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file, save_file

import detr_peg
from detr_peg import load_model
from detr_peg.cli.main import main
from detr_peg.convert import convert_transformers
from detr_peg.data.padding import pad_images
from detr_peg.errors import CheckpointError
from detr_peg.models import build_model
from tests.convert.test_transformers_parity import images_of_different_sizes
from tests.convert.transformers_models import load


def _edited(folder, tmp_path, **changes):
    """A copy of ``folder`` whose config.json has ``changes`` (a value of ``None`` removes the key)."""
    copy = shutil.copytree(folder, tmp_path / "edited")
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_the_command_reports_the_conversion_and_stores_the_label_map(transformers_folder, tmp_path, capsys):
    dst = tmp_path / "detr.pth"
    assert main(["convert", str(transformers_folder("detr")), str(dst)]) == 0
    printed = capsys.readouterr().out
    assert "Converted Transformers DETR checkpoint" in printed
    assert "new keys (initialised fresh): 0 none" in printed and "unused keys: 0 none" in printed
    assert "label map: 4 categories (circle, square, triangle, cross)" in printed  # id 0, "N/A", is no category
    loaded = load_model(dst)
    assert loaded.label_map.category_ids == [1, 2, 3, 4]
    assert loaded.label_map.names == ["circle", "square", "triangle", "cross"]
    assert loaded.config.model.num_classes == 5 and loaded.config.data.contiguous_labels is False


def test_the_layouts_of_transformers_4_convert_to_the_same_model(transformers_folder, tmp_path):
    """A Transformers 4 config.json (timm backbone named at the top level) and a pytorch_model.bin weights file."""
    folder = transformers_folder("detr")
    expected = convert_transformers(folder)
    old = _edited(folder, tmp_path, backbone_config=None, use_timm_backbone=True, backbone="resnet18")
    (old / "model.safetensors").unlink()
    torch.save(load_file(folder / "model.safetensors"), old / "pytorch_model.bin")
    report = convert_transformers(old)
    assert report.config == expected.config
    assert report.state_dict.keys() == expected.state_dict.keys()
    for key, value in expected.state_dict.items():
        assert torch.equal(report.state_dict[key], value), key


def test_converting_to_peg_keeps_every_weight_and_starts_only_the_peg(transformers_folder, tmp_path, capsys):
    dst = tmp_path / "peg.pth"
    assert main(["convert", str(transformers_folder("deformable-two-stage")), str(dst), "model.position.name=peg"]) == 0
    printed = capsys.readouterr().out
    assert "unused keys: 0 none" in printed and "position peg" in printed
    sine = convert_transformers(transformers_folder("deformable-two-stage"))
    peg = load_model(dst).model.state_dict()
    fresh = sorted(set(peg) - set(sine.state_dict))
    assert fresh and all(k.startswith("transformer.position.pegs.") for k in fresh)
    assert f"new keys (initialised fresh): {len([k for k in fresh if 'num_batches' not in k])}" in printed
    for key, value in sine.state_dict.items():
        assert torch.equal(peg[key], value), key


REFUSALS = [
    ({"decoder_attention_heads": 4}, "decoder_attention_heads=4"),
    ({"decoder_ffn_dim": 128}, "decoder_ffn_dim=128"),
    ({"activation_function": "silu"}, 'activation_function="silu"'),
    ({"position_embedding_type": "rotary"}, 'position_embedding_type="rotary"'),
    ({"num_channels": 1}, "num_channels=1"),
    ({"model_type": "conditional_detr"}, 'model_type="conditional_detr"'),
    ({"architectures": ["DetrForSegmentation"]}, 'architectures=["DetrForSegmentation"]'),
    ({"auxiliary_loss": True}, "auxiliary_loss=true"),
]


@pytest.mark.parametrize(("changes", "named"), REFUSALS, ids=[next(iter(c)) for c, _ in REFUSALS])
def test_a_setting_detr_peg_cannot_represent_is_refused_in_one_line(
    changes, named, transformers_folder, tmp_path, capsys
):
    folder = _edited(transformers_folder("detr"), tmp_path, **changes)
    assert main(["convert", str(folder), str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"config.json has {named}" in err, err
    assert not (tmp_path / "out.pth").exists()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"downsample_in_bottleneck": True}, "backbone_config.downsample_in_bottleneck=true"),
        ({"hidden_sizes": [32, 64, 128, 256]}, "backbone_config.hidden_sizes=[32, 64, 128, 256]"),
        ({"depths": [1, 1, 1, 1]}, "backbone_config.depths=[1, 1, 1, 1]"),
    ],
)
def test_a_resnet_torchvision_does_not_have_is_refused(changes, named, transformers_folder, tmp_path, capsys):
    folder = transformers_folder("detr-resnet-learned")
    backbone = json.loads((folder / "config.json").read_text())["backbone_config"]
    edited = _edited(folder, tmp_path, backbone_config={**backbone, **changes})
    assert main(["convert", str(edited), str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"config.json has {named}" in err, err


def test_auxiliary_loss_changes_what_transformers_detr_computes(transformers_folder, tmp_path):
    """Measured: with auxiliary_loss, Transformers' DETR normalises the state it passes between decoder layers.

    The converted model (without auxiliary_loss, the official forward pass,
    which the parity test checks) and Transformers' model of the same
    weights with ``auxiliary_loss: true`` differ, on this model by 0.29 in
    the logits and 0.048 in the boxes (documented in docs/huggingface.md).
    """
    folder = transformers_folder("detr")
    with_aux = _edited(folder, tmp_path, auxiliary_loss=True)
    with pytest.raises(CheckpointError, match="auxiliary_loss"):
        convert_transformers(with_aux)
    report = convert_transformers(folder)
    model = build_model(report.config).eval()
    model.load_state_dict(report.state_dict)
    images, mask = pad_images(images_of_different_sizes(), model.size_divisibility)
    with torch.no_grad():
        ours = model(images, mask)
        theirs = load(with_aux)(pixel_values=images, pixel_mask=(~mask).long())
    logits = (ours["pred_logits"] - theirs.logits).abs().max().item()
    boxes = (ours["pred_boxes"] - theirs.pred_boxes).abs().max().item()
    print(f"auxiliary_loss: largest difference {logits:.3g} in the logits, {boxes:.3g} in the boxes")
    assert logits > 0.05, logits


def test_a_hub_name_offline_says_to_pass_a_local_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "facebook/detr-resnet-50", "out.pth"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "facebook/detr-resnet-50 is not in the local Hugging Face cache" in err and "pass its local path" in err
    assert not (tmp_path / "out.pth").exists()


def test_from_pretrained_converts_a_transformers_folder(transformers_folder):
    folder = transformers_folder("deformable")
    detector = detr_peg.Detector.from_pretrained(folder, device="cpu")
    report = convert_transformers(folder)
    assert detector.config == report.config
    for key, value in report.state_dict.items():
        assert torch.equal(detector.model.state_dict()[key], value), key
    assert detector.class_names[:3] == ["class 0", "circle", "square"]


def test_sharded_weights_read_as_one_file(transformers_folder, tmp_path):
    folder = transformers_folder("detr")
    load(folder).save_pretrained(tmp_path / "sharded", max_shard_size="20MB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    expected = convert_transformers(folder).state_dict
    report = convert_transformers(tmp_path / "sharded")
    assert report.state_dict.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(report.state_dict[key], value), key


def test_a_shared_head_stored_under_another_index_fills_every_layer(transformers_folder, tmp_path):
    """Without refinement every layer's head is one module; a file may keep it under any index."""
    folder = transformers_folder("deformable")
    expected = convert_transformers(folder).state_dict
    moved = shutil.copytree(folder, tmp_path / "moved")
    state = load_file(moved / "model.safetensors")
    for key in [k for k in state if k.startswith(("class_embed.0.", "bbox_embed.0."))]:
        state[key.replace(".0.", ".1.", 1)] = state.pop(key)
    save_file(state, moved / "model.safetensors", metadata={"format": "pt"})
    report = convert_transformers(moved)
    assert report.new_keys == []
    for key, value in expected.items():
        assert torch.equal(report.state_dict[key], value), key


@pytest.mark.parametrize("where", ["parent", "absolute", "backslashes"])
def test_a_shard_named_outside_the_folder_is_refused(transformers_folder, tmp_path, capsys, where):
    """Shard names follow the rule of image file names: relative, and inside the folder."""
    folder = tmp_path / "models" / "sharded"
    load(transformers_folder("detr")).save_pretrained(folder, max_shard_size="20MB")
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "elsewhere" / first
    outside.parent.mkdir()
    shutil.copyfile(folder / first, outside)  # a readable file there: only the name's rule can refuse it
    name = {
        "parent": f"../../elsewhere/{first}",
        "absolute": str(outside),
        "backslashes": f"..\\..\\elsewhere\\{first}",
    }
    index["weight_map"] = {k: (name[where] if v == first else v) for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    dst = tmp_path / "converted.pth"
    assert main(["convert", str(folder), str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"names the shard {name[where]!r}" in err[0], err
    assert ("absolute" if where == "absolute" else "leaves the model folder") in err[0]
    assert not dst.exists()
    with pytest.raises(CheckpointError, match="names the shard"):
        detr_peg.Detector.from_pretrained(folder, device="cpu")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_weights_are_refused_not_cast(transformers_folder, tmp_path, capsys, dtype):
    """A float tensor stored under an integer dtype (its bytes read as I32, ...) is refused by convert and by
    Detector.from_pretrained, never cast into weights around 1e9."""
    folder = shutil.copytree(transformers_folder("detr"), tmp_path / "ints")
    state = load_file(folder / "model.safetensors")
    key = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    value = state[key].contiguous()  # int32: the float's bytes read as integers, as a wrong header would say
    state[key] = value.view(torch.int32) if dtype == torch.int32 else (value * 100).to(dtype)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    dst = tmp_path / "converted.pth"
    assert main(["convert", str(folder), str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    name = str(dtype).removeprefix("torch.")
    assert len(err) == 1 and f"holds {name} values, not the float32 weights it needs" in err[0], err
    assert not dst.exists()
    with pytest.raises(CheckpointError, match=f"holds {name} values"):
        detr_peg.Detector.from_pretrained(folder, device="cpu")


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda p: p.write_text("[" * 200_000 + "]" * 200_000), "is nested too deeply to parse"),
        (lambda p: p.write_bytes(b'{"model_type": "detr", "x": "\xff"}'), "is not UTF-8 text"),
        (lambda p: p.write_text('{"a": ' + "[" * 40 + "]" * 40 + "}"), "is nested more than 32 levels deep"),
    ],
    ids=["200000 levels", "not UTF-8", "deeper than a config"],
)
def test_a_damaged_config_json_is_one_line(transformers_folder, tmp_path, capsys, damage, says):
    """config.json and the shard index are read by the bounded reader of every JSON file."""
    folder = shutil.copytree(transformers_folder("detr"), tmp_path / "damaged")
    damage(folder / "config.json")
    assert main(["convert", str(folder), str(tmp_path / "out.pth")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"Model config {folder / 'config.json'} {says}" in err[0], err


@pytest.mark.parametrize("written", ["hub-folder", "its-safetensors", "training-checkpoint"])
def test_what_detr_peg_wrote_is_not_converted(tmp_path, capsys, written):
    """A Hub folder of save_pretrained, its weights file or a training checkpoint is named as detr_peg's own."""
    from detr_peg.checkpoint.format import save_checkpoint
    from tests.engine.tiny_run import TINY_MODEL

    detector = detr_peg.Detector.from_config(None, [*TINY_MODEL, "model.num_classes=3"], device="cpu")
    detector.save_pretrained(tmp_path / "hub")
    save_checkpoint(tmp_path / "checkpoint.pth", detector.config, detector.model.state_dict(), None)
    src = {"hub-folder": "hub", "its-safetensors": "hub/model.safetensors", "training-checkpoint": "checkpoint.pth"}
    dst = tmp_path / "converted.pth"
    assert main(["convert", str(tmp_path / src[written]), str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was written by detr_peg and needs no conversion; give " in err[0], err
    call = "Detector.from_pretrained" if written == "hub-folder" else "Detector.from_checkpoint"
    assert call in err[0] and not dst.exists()
