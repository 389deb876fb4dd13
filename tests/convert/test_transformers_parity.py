"""A converted Transformers checkpoint computes what Transformers computes, on a padded batch of mixed sizes.

Each case builds a small random Transformers model (no download), saves it
with ``save_pretrained``, converts the folder (``convert_transformers``, what
``detr-peg convert`` runs; the command itself is tested in
``test_transformers_convert.py``) and compares the detr_peg model's class
logits and boxes with those of the model Transformers loads from the same
folder, on the same padded batch of two images of different sizes, at the
tolerance of the official-parity tests. The cases cover DETR and the three
Deformable-DETR variants, sine and learned encodings, and the three backbone
layouts Transformers writes: a timm ResNet (torchvision's names),
Transformers' own ResNet, and a timm ResNet of another layout
(``resnet18d``, kept as a timm backbone).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from detr_peg.convert import convert_transformers
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.models import build_model
from tests.convert.transformers_models import CASES, ID2LABEL, load
from tests.parity import assert_close


def images_of_different_sizes() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(3, 70, 90, generator=generator), torch.randn(3, 100, 64, generator=generator)]


def untie_class_heads(folder) -> None:
    """Store one class head per decoder layer, as Transformers 4 and the official code train a refining model."""
    path = folder / "model.safetensors"
    state = load_file(path)
    generator = torch.Generator().manual_seed(1)
    for index in range(1, 2):
        for name in ("weight", "bias"):
            first = state[f"class_embed.0.{name}"]
            state[f"class_embed.{index}.{name}"] = first + 0.2 * torch.randn(first.shape, generator=generator)
    save_file(state, path, metadata={"format": "pt"})


@pytest.mark.parametrize("case", list(CASES))
def test_converted_model_matches_transformers(case, transformers_folder, tmp_path):
    _, (source, backbone, encoding) = CASES[case]
    folder = transformers_folder(case)
    if case == "deformable-refine":
        folder = shutil.copytree(folder, tmp_path / "hf")
        untie_class_heads(folder)
    report = convert_transformers(folder)
    assert (report.new_keys, report.unused_keys) == ([], [])
    cfg = report.config.model
    assert (cfg.backbone.source, cfg.backbone.name, cfg.position.name) == (source, backbone, encoding)
    label_map = LabelMap.from_dict(report.label_map)
    assert label_map.names == [name for name in ID2LABEL.values() if name != "N/A"] and not label_map.contiguous
    model = build_model(report.config).eval()
    model.load_state_dict(report.state_dict)

    reference = load(folder)
    images, mask = pad_images(images_of_different_sizes(), model.size_divisibility)
    assert mask.any(), "the batch must hold padding"
    with torch.no_grad():
        ours = model(images, mask)
        theirs = reference(pixel_values=images, pixel_mask=(~mask).long())
    assert_close(ours["pred_logits"], theirs.logits, "pred_logits")
    assert_close(ours["pred_boxes"], theirs.pred_boxes, "pred_boxes")
