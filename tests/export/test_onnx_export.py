"""ONNX export: small DETR and Deformable-DETR models exported once (dynamic batch and size, traced at
96 x 128) and run in ONNX Runtime on other sizes, batch 1 and padded batch 3, against PyTorch.

Exporting is slow (tens of seconds per model on a small CPU), so each model is
exported once per module and every test reuses the file.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


from detr_peg.config import load_config
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import ConfigError, DataError
from detr_peg.export.onnx_export import ExportWrapper, export_onnx
from detr_peg.export.onnx_runtime import OnnxDetector
from detr_peg.models import build_model, build_postprocessor
from detr_peg.models.loading import LoadedModel
from tests.models.deformable.small_model import SMALL

TINY_DETR = [
    "model.backbone.name=resnet18",
    "model.backbone.out_stages=[3]",
    "model.num_classes=4",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=1",
    "model.transformer.dec_layers=1",
    "model.transformer.dim_feedforward=64",
    "model.num_queries=8",
]
#: Two levels (stage 3 and one extra stride-2 level): the export of four levels costs half as much again.
SMALL_DEFORMABLE = [
    *SMALL,
    "model.backbone.out_stages=[3]",
    "model.transformer.num_feature_levels=2",
    "model.transformer.enc_layers=1",
    "eval.num_select=12",
]

#: name -> (config overrides, export with post-processing, run the exporter's graph optimizer). Every encoding
#: is exported with DETR; Deformable-DETR once, with PEG, box refinement and two-stage (each Deformable-DETR
#: export costs 20-40 s here), with the default level-mask rule and two levels (the backbone's and one more
#: strided convolution). Its single-stage path with the official weights is exported (at a fixed size) by
#: ``test_onnx_parity_official``; its learned tables are the same module as DETR's (one per level).
#: ``detr_sine`` derives its mask by ``model.mask_rule=stride`` (the same function per level as in
#: Deformable-DETR), the others by the default rule.
MODELS = {
    "detr_peg": ([*TINY_DETR, "model.position.name=peg"], True, True),
    "detr_sine": ([*TINY_DETR, "model.position.name=sine", "model.mask_rule=stride"], False, False),
    "detr_learned": ([*TINY_DETR, "model.position.name=learned", "model.position.num_embeddings=20"], False, False),
    "deformable_peg_refine_two_stage": (
        [
            *SMALL_DEFORMABLE,
            "model.position.name=peg",
            "model.with_box_refine=true",
            "model.two_stage=true",
        ],
        True,
        False,
    ),
}
DEFORMABLE = "deformable_peg_refine_two_stage"
#: (H, W) of the padded batches: all differ from the traced 96 x 128, one is larger in both directions.
SIZES = [(80, 112), (128, 96), (200, 264)]
ATOL = 1e-4

pytestmark = pytest.mark.slow


def _random_batchnorm_statistics(model: torch.nn.Module) -> None:
    # Fresh BatchNorm layers (PEG) have identity statistics; make eval mode do some work.
    g = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=g) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=g) + 0.5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (LoadedModel, ONNX Runtime detector); each model is exported on first use."""
    folder = tmp_path_factory.mktemp("onnx")
    cache = {}

    def get(name):
        if name not in cache:
            overrides, postprocess, optimize = MODELS[name]
            cfg = load_config(None, overrides)
            torch.manual_seed(0)
            model = build_model(cfg)
            with torch.no_grad():
                _random_batchnorm_statistics(model)
            label_map = LabelMap(category_ids=[3, 5, 8, 13, 21], names=list("abcde"), contiguous=False)
            loaded = LoadedModel(model.eval(), build_postprocessor(cfg), cfg, label_map)
            path = export_onnx(loaded, folder / f"{name}.onnx", postprocess=postprocess, optimize=optimize)
            cache[name] = (loaded, OnnxDetector(path))
        return cache[name]

    return get


def padded_batch(batch: int, size: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images of different sizes padded to ``size`` (the first fills it), their mask and original sizes."""
    g = torch.Generator().manual_seed(seed)
    h, w = size
    images = torch.zeros(batch, 3, h, w)
    mask = torch.ones(batch, h, w, dtype=torch.bool)
    sizes = []
    for i in range(batch):
        ih, iw = (h, w) if i == 0 else (h - 13 * i, w - 21 * i)
        images[i, :, :ih, :iw] = torch.randn(3, ih, iw, generator=g)
        mask[i, :ih, :iw] = False
        sizes.append((ih * 2, iw * 2))  # "original" images twice the size
    return images, mask, torch.tensor(sizes)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_runtime_matches_pytorch_on_other_sizes(exported, name, batch):
    model, detector = exported(name)[0].model, exported(name)[1]
    for size in SIZES:
        images, mask, _ = padded_batch(batch, size)
        with torch.no_grad():
            expected = model(images, mask)
        got = detector(images, mask)
        for key in ("pred_logits", "pred_boxes"):
            torch.testing.assert_close(
                got[key], expected[key], rtol=0, atol=ATOL, msg=lambda m, size=size, key=key: f"{size} {key}: {m}"
            )


def test_stride_mask_rule_is_in_the_graph(exported):
    name = "detr_sine"
    # On this canvas (not a multiple of the strides 16, 32, 64) the two rules give other outputs, and the
    # graph matches PyTorch on it, so the stride rule was exported, not the official one.
    model, detector = exported(name)[0].model, exported(name)[1]
    images, mask, _ = padded_batch(3, (90, 118))
    torch.testing.assert_close(
        detector(images, mask)["pred_boxes"], model(images, mask)["pred_boxes"], rtol=0, atol=ATOL
    )
    with torch.no_grad():
        stride = model(images, mask)["pred_boxes"]
        model.mask_rule = "nearest"
        try:
            nearest = model(images, mask)["pred_boxes"]
        finally:
            model.mask_rule = "stride"
    assert float((stride - nearest).abs().max()) > 1e-3


@pytest.mark.parametrize("name", ["detr_peg", DEFORMABLE])
def test_postprocessed_outputs_match_the_postprocessor(exported, name):
    loaded, detector = exported(name)
    images, mask, orig_sizes = padded_batch(3, SIZES[2], seed=4)
    with torch.no_grad():
        expected = loaded.postprocessor(loaded.model(images, mask), orig_sizes)
    got = detector.run(images, mask, orig_sizes)
    assert got["scores"].shape[0] == 3
    for i, det in enumerate(expected):
        torch.testing.assert_close(got["scores"][i], det["scores"], rtol=0, atol=ATOL)
        torch.testing.assert_close(got["boxes"][i], det["boxes"], rtol=1e-4, atol=1e-2)  # pixels
        assert torch.equal(got["labels"][i], det["labels"])


def test_graph_metadata_and_dynamic_axes(exported):
    loaded, detector = exported("detr_peg")
    assert detector.config == loaded.config
    assert detector.label_map == loaded.label_map.to_dict()
    assert detector.size_divisibility == loaded.model.size_divisibility == 16
    images = detector.session.get_inputs()[0]
    assert images.name == "images" and images.shape[0] == "batch" and isinstance(images.shape[2], str)
    assert detector.input_names == ["images", "mask", "orig_sizes"]
    assert detector.output_names == ["pred_logits", "pred_boxes", "scores", "labels", "boxes"]


def test_deformable_attention_is_exported_as_one_grid_sample_per_level_and_the_setting_restored(exported):
    import onnx

    from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn

    loaded, detector = exported(DEFORMABLE)
    layers = [m for m in loaded.model.modules() if isinstance(m, MSDeformAttn)]
    ops = [node.op_type for node in onnx.load(str(detector.path)).graph.node]
    assert ops.count("GridSample") == sum(layer.n_levels for layer in layers)
    assert "GatherND" not in ops  # the gathers of impl="gather" are not in the graph
    assert {layer.impl for layer in layers} == {"embedding_bag"}


def test_learned_encoding_larger_than_its_table_fails_like_pytorch(exported):
    # 20 rows per table at stride 16: a 600-pixel side is a 38-pixel feature map.
    model, detector = exported("detr_learned")[0].model, exported("detr_learned")[1]
    images, mask, _ = padded_batch(1, (600, 128))
    with pytest.raises(ValueError, match="larger than the learned position tables"):
        model(images, mask)
    with pytest.raises(DataError, match=r"failed on a batch of shape \[1, 3, 600, 128\] \(onnxruntime: .*INVALID_ARGUMENT"
                       r".*\); its learned position tables take images up to their size: lower "):  # fmt: skip
        detector(images, mask)


def test_fixed_size_export(tmp_path):
    overrides, _, _ = MODELS["detr_sine"]
    cfg = load_config(None, overrides)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    path = export_onnx(model, tmp_path / "fixed.onnx", image_size=(96, 128), batch_size=2, optimize=False)
    detector = OnnxDetector(path)
    assert detector.session.get_inputs()[0].shape == [2, 3, 96, 128]
    assert detector.config is None  # the model carried none

    def same_as_pytorch(images: Tensor, mask: Tensor, model_images: Tensor, model_mask: Tensor) -> None:
        with torch.no_grad():
            expected = ExportWrapper(model)(model_images, model_mask)
        got = detector(images, mask)
        torch.testing.assert_close(got["pred_logits"], expected[0], rtol=0, atol=ATOL)
        torch.testing.assert_close(got["pred_boxes"], expected[1], rtol=0, atol=ATOL)

    images, mask, _ = padded_batch(2, (96, 128))
    same_as_pytorch(images, mask, images, mask)
    images, mask, _ = padded_batch(2, (64, 112))  # smaller: padded up to the graph's size, as to the stride
    pad = (0, 128 - 112, 0, 96 - 64)
    same_as_pytorch(images, mask, F.pad(images, pad), F.pad(mask, pad, value=True))
    # Padded past the graph's size (to a stride) with padding only: the padding is cut off, the content kept.
    past = (0, 32, 0, 64)  # 128 x 144
    same_as_pytorch(
        F.pad(images, past), F.pad(mask, past, value=True), F.pad(images, pad), F.pad(mask, pad, value=True)
    )
    # Another batch size: cut into batches of 2, the last filled with copies whose outputs are dropped.
    images, mask, _ = padded_batch(3, (96, 128))
    same_as_pytorch(images, mask, images, mask)
    images, mask, _ = padded_batch(2, (128, 128))  # larger content: one sentence, not onnxruntime's
    with pytest.raises(DataError, match=r"fixed.onnx was exported for image batches of shape \[2, 3, 96, 128\], "
                       r"not \[2, 3, 128, 128\]; export without --image-size for any size, or resize images to fit "
                       r"\(data.val_scale, data.val_max_size\)\.$"):  # fmt: skip
        detector(images, mask)


def test_an_opset_the_exporter_cannot_convert_to_is_refused_and_nothing_written(tmp_path):
    """torch keeps opset 18 when its converter fails, saying so in a log line only: the file would lie."""
    cfg = load_config(None, MODELS["detr_sine"][0])
    model = build_model(cfg).eval()
    with pytest.raises(ConfigError, match=r"^opset 26: torch's ONNX exporter could not convert the model to it and "
                       r"wrote opset 18; choose opset 18 \(nothing was written\)\.$"):  # fmt: skip
        export_onnx(model, tmp_path / "m.onnx", image_size=(96, 128), batch_size=2, optimize=False, opset=26)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["detr_peg", DEFORMABLE])
def test_padding_changes_onnx_outputs_exactly_as_it_changes_pytorch_outputs(exported, name):
    # The last image of a padded batch against the same image alone at its own size: whatever
    # the padding changes in PyTorch (the backbone's convolutions see it at the image border),
    # it changes the same way in the exported graph.
    model, detector = exported(name)[0].model, exported(name)[1]
    images, mask, _ = padded_batch(3, SIZES[2], seed=2)
    h, w = (~mask[2]).sum(0).amax().item(), (~mask[2]).sum(1).amax().item()
    alone, alone_mask = images[2:, :, :h, :w], mask[2:, :h, :w]
    with torch.no_grad():
        torch_padded, torch_alone = model(images, mask), model(alone, alone_mask)
    onnx_padded, onnx_alone = detector(images, mask), detector(alone, alone_mask)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(onnx_alone[key], torch_alone[key], rtol=0, atol=ATOL)
        torch.testing.assert_close(
            onnx_padded[key][2] - onnx_alone[key][0], torch_padded[key][2] - torch_alone[key][0], rtol=0, atol=2 * ATOL
        )


def test_session_options(exported):
    from detr_peg.errors import ConfigError
    from detr_peg.export.onnx_session import GRAPH_OPTIMIZATION_LEVELS, session_options

    options = session_options(threads=2, graph_optimization="extended")
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_EXTENDED")
    assert not options.enable_mem_pattern and not options.enable_cpu_mem_arena
    with pytest.raises(
        ConfigError, match="graph_optimization='fast' is not .*: valid are disable, basic, extended, all"
    ):
        session_options(graph_optimization="fast")
    # Every level gives the same outputs, for DETR and for the GridSample attention of Deformable-DETR.
    images, mask, _ = padded_batch(1, SIZES[0])
    for name in ("detr_peg", DEFORMABLE):
        _, reference = exported(name)
        expected = reference(images, mask)
        for level in GRAPH_OPTIMIZATION_LEVELS:
            got = OnnxDetector(reference.path, graph_optimization=level)(images, mask)
            for key in ("pred_logits", "pred_boxes"):
                torch.testing.assert_close(got[key], expected[key], rtol=0, atol=ATOL)
