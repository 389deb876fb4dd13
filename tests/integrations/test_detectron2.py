"""The detectron2 integration.

detectron2 is not on PyPI, so most tests here skip (with the reason) where it
is not installed, as in CI. The import-error test runs everywhere: importing
the subpackage without detectron2 must fail with one sentence on how to
install it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO_ROOT
from tests.tools.tool_module import load_tool

SKIP_REASON = (
    "detectron2 is not installed (it is not on PyPI; install it from source as described at "
    "https://detectron2.readthedocs.io/en/latest/tutorials/install.html)"
)
SMALL = [
    "model.backbone.name=resnet18",
    "model.backbone.weights=null",
    "model.num_queries=5",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=1",
    "model.transformer.dec_layers=1",
    "model.transformer.dim_feedforward=64",
]
NUM_CLASSES = 3
ARCHS = {"DetrPeg": "detr", "DeformableDetrPeg": "deformable_detr"}
D2_CONFIGS = sorted((REPO_ROOT / "configs" / "detectron2").glob("*.yaml"))


# ---------------------------------------------------------------- everywhere


def _forget_integration(monkeypatch) -> None:
    for name in list(sys.modules):
        if name == "detr_peg.integrations.detectron2" or name.startswith("detr_peg.integrations.detectron2."):
            monkeypatch.delitem(sys.modules, name)


def test_import_without_detectron2_says_how_to_install(monkeypatch):
    _forget_integration(monkeypatch)
    monkeypatch.setitem(sys.modules, "detectron2", None)  # makes `import detectron2` fail
    with pytest.raises(ImportError, match=r"needs detectron2.*not on PyPI.*install.html.*pip install") as info:
        importlib.import_module("detr_peg.integrations.detectron2")
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")  # one sentence
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_import_without_detectron2_in_a_fresh_interpreter():
    code = "import sys; sys.modules['detectron2'] = None; import detr_peg.integrations.detectron2"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: detr_peg.integrations.detectron2 needs detectron2"), proc.stderr
    assert "detectron2.readthedocs.io" in last


def test_the_core_never_imports_detectron2():
    code = (
        "import sys; import detr_peg, detr_peg.models.builder, detr_peg.data, detr_peg.checkpoint; "
        "print(any(m == 'detectron2' or m.startswith('detectron2.') for m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------- where detectron2 is


@pytest.fixture
def d2():
    pytest.importorskip("detectron2", reason=SKIP_REASON)
    return importlib.import_module("detr_peg.integrations.detectron2")


@pytest.fixture
def cfg(d2):
    from detectron2.config import get_cfg

    cfg = get_cfg()
    d2.add_detr_peg_config(cfg)
    cfg.merge_from_file(str(REPO_ROOT / "configs" / "detectron2" / "Base-DetrPeg.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.DETR_PEG.OVERRIDES = list(SMALL)
    cfg.MODEL.DETR_PEG.NUM_CLASSES = NUM_CLASSES
    return cfg


def batched_inputs(with_instances: bool = True) -> list[dict]:
    """Two uint8 images of different sizes; ``height``/``width`` ask for twice the input size."""
    from detectron2.structures import Boxes, Instances

    g = torch.Generator().manual_seed(0)
    items = []
    for (h, w), boxes, classes in [
        ((60, 80), [[5.0, 6.0, 40.0, 50.0]], [2]),
        ((72, 56), [[0.0, 0.0, 20.0, 30.0], [10.0, 30.0, 56.0, 72.0]], [0, 1]),
    ]:
        item = {
            "image": torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8),
            "height": 2 * h,
            "width": 2 * w,
        }
        if with_instances:
            instances = Instances((h, w))
            instances.gt_boxes = Boxes(torch.tensor(boxes))
            instances.gt_classes = torch.tensor(classes)
            item["instances"] = instances
        items.append(item)
    return items


def test_config_keys_are_added(d2, cfg):
    node = cfg.MODEL.DETR_PEG
    assert set(node.keys()) == {"CONFIG_FILE", "OVERRIDES", "NUM_CLASSES", "OUT_FEATURES"}
    assert cfg.SOLVER.OPTIMIZER == "ADAMW" and cfg.SOLVER.BACKBONE_MULTIPLIER == pytest.approx(0.2)
    assert cfg.INPUT.CROP.RESIZE_SHORTEST_EDGE == [400, 500, 600]
    config = d2.detr_peg_config(cfg, arch="deformable_detr")
    assert config.model.arch == "deformable_detr" and config.model.num_classes == NUM_CLASSES
    assert config.model.backbone.name == "resnet18"


@pytest.mark.parametrize("path", D2_CONFIGS, ids=[p.stem for p in D2_CONFIGS])
def test_shipped_detectron2_configs_resolve(d2, path, monkeypatch):
    from detectron2.config import get_cfg

    monkeypatch.chdir(REPO_ROOT)  # CONFIG_FILE paths are relative to the repository root
    cfg = get_cfg()
    d2.add_detr_peg_config(cfg)
    cfg.merge_from_file(str(path))
    arch = ARCHS.get(cfg.MODEL.META_ARCHITECTURE)
    config = d2.detr_peg_config(cfg, arch=arch)
    assert config.model.num_classes == 80
    assert cfg.INPUT.FORMAT == "RGB"


def test_architecture_mismatch_is_a_config_error(d2, cfg):
    from detr_peg.errors import ConfigError

    cfg.MODEL.META_ARCHITECTURE = "DetrPeg"
    cfg.MODEL.DETR_PEG.CONFIG_FILE = str(REPO_ROOT / "configs" / "deformable_detr_r50_peg.yaml")
    with pytest.raises(ConfigError, match="DeformableDetrPeg"):
        d2.detr_peg_config(cfg, arch="detr")


@pytest.mark.parametrize("source,name", [("torchvision", "resnet18"), ("timm", "convnext_atto")])
@pytest.mark.parametrize("out_features", [["res5"], ["res2", "res3", "res4", "res5"]])
def test_backbone_is_registered_and_output_shape_is_true(d2, cfg, source, name, out_features):
    from detectron2.modeling import BACKBONE_REGISTRY, build_backbone

    assert BACKBONE_REGISTRY.get("build_detr_peg_backbone") is d2.build_detr_peg_backbone
    cfg.MODEL.BACKBONE.NAME = "build_detr_peg_backbone"
    cfg.MODEL.DETR_PEG.OVERRIDES = [f"model.backbone.source={source}", f"model.backbone.name={name}"]
    cfg.MODEL.DETR_PEG.OUT_FEATURES = out_features
    backbone = build_backbone(cfg)
    assert isinstance(backbone, d2.DetrPegBackbone)
    shapes = backbone.output_shape()
    assert list(shapes) == out_features
    features = backbone(torch.randn(2, 3, 64, 96))
    assert list(features) == out_features
    for key, feature in features.items():
        stride = shapes[key].stride
        assert stride == {"res2": 4, "res3": 8, "res4": 16, "res5": 32}[key]
        assert feature.shape == (2, shapes[key].channels, 64 // stride, 96 // stride)


def test_backbone_rejects_unknown_output_names(d2, cfg):
    from detectron2.modeling import build_backbone

    from detr_peg.errors import ConfigError

    cfg.MODEL.BACKBONE.NAME = "build_detr_peg_backbone"
    cfg.MODEL.DETR_PEG.OUT_FEATURES = ["res6"]
    with pytest.raises(ConfigError, match="res2, res3, res4, res5"):
        build_backbone(cfg)


@pytest.mark.parametrize("meta_arch", list(ARCHS))
def test_meta_arch_trains_and_infers(d2, cfg, meta_arch):
    from detectron2.modeling import META_ARCH_REGISTRY, build_model
    from detectron2.structures import Instances

    cfg.MODEL.META_ARCHITECTURE = meta_arch
    assert META_ARCH_REGISTRY.get(meta_arch) is getattr(d2, meta_arch)
    torch.manual_seed(0)
    model = build_model(cfg)
    assert model.detector.num_classes == NUM_CLASSES
    criterion_weights = model.criterion.weight_dict

    model.train()
    losses = model(batched_inputs())
    assert losses and set(losses) <= set(criterion_weights)
    assert all(torch.isfinite(v) and v.dim() == 0 for v in losses.values())
    sum(losses.values()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)

    model.eval()
    with torch.no_grad():
        results = model(batched_inputs(with_instances=False))
    assert len(results) == 2
    for result, item in zip(results, batched_inputs(with_instances=False)):
        instances = result["instances"]
        assert isinstance(instances, Instances)
        assert instances.image_size == (item["height"], item["width"])
        assert len(instances) > 0 and instances.has("scores") and instances.has("pred_classes")
        boxes = instances.pred_boxes.tensor
        assert (boxes >= 0).all()
        assert (boxes[:, 0::2] <= item["width"]).all() and (boxes[:, 1::2] <= item["height"]).all()
        assert ((instances.pred_classes >= 0) & (instances.pred_classes < NUM_CLASSES)).all()


@pytest.mark.parametrize("arch", list(ARCHS.values()))
def test_the_generic_meta_arch_builds_the_architecture_of_the_detr_peg_config(d2, cfg, arch):
    from detectron2.modeling import META_ARCH_REGISTRY, build_model

    from detr_peg.models.registry import MODELS

    # One meta-architecture per registration that names one, plus the generic one.
    assert {n: c.arch for n, c in d2.meta_arch.FAMILY_META_ARCHITECTURES.items()} == {
        MODELS.get(a).detectron2_name: a for a in MODELS.names() if MODELS.get(a).detectron2_name
    }
    cfg.MODEL.META_ARCHITECTURE = "DetrPegModel"
    cfg.MODEL.DETR_PEG.OVERRIDES = [*cfg.MODEL.DETR_PEG.OVERRIDES, f"model.arch={arch}"]
    assert META_ARCH_REGISTRY.get("DetrPegModel") is d2.DetrPegModel
    torch.manual_seed(0)
    model = build_model(cfg)
    expected = MODELS.get(arch).build_model(d2.detr_peg_config(cfg))
    assert type(model.detector) is type(expected)
    model.eval()
    with torch.no_grad():
        assert len(model(batched_inputs(with_instances=False))) == 2


def test_bgr_input_equals_rgb_input(d2, cfg):
    """A BGR model given BGR images (and BGR statistics) sees exactly what an RGB model sees."""
    from detectron2.modeling import build_model

    cfg.MODEL.META_ARCHITECTURE = "DetrPeg"
    torch.manual_seed(0)
    rgb = build_model(cfg).eval()
    cfg.INPUT.FORMAT = "BGR"
    cfg.MODEL.PIXEL_MEAN = cfg.MODEL.PIXEL_MEAN[::-1]
    cfg.MODEL.PIXEL_STD = cfg.MODEL.PIXEL_STD[::-1]
    bgr = build_model(cfg).eval()
    bgr.load_state_dict(rgb.state_dict())
    inputs = batched_inputs(with_instances=False)
    flipped = [{**item, "image": item["image"].flip(0)} for item in inputs]
    images_rgb, mask_rgb, _ = rgb.preprocess_images(inputs)
    images_bgr, mask_bgr, _ = bgr.preprocess_images(flipped)
    torch.testing.assert_close(images_bgr, images_rgb)
    assert torch.equal(mask_bgr, mask_rgb) and mask_rgb[1, :, 56:].all() and not mask_rgb[0, :60, :80].any()


def test_targets_are_normalized_cxcywh(d2, cfg):
    from detectron2.modeling import build_model

    cfg.MODEL.META_ARCHITECTURE = "DetrPeg"
    model = build_model(cfg)
    targets = model.prepare_targets(batched_inputs(), [(60, 80), (72, 56)])
    torch.testing.assert_close(targets[0]["boxes"], torch.tensor([[22.5 / 80, 28.0 / 60, 35.0 / 80, 44.0 / 60]]))
    assert targets[1]["labels"].dtype == torch.int64 and targets[1]["labels"].tolist() == [0, 1]


def test_class_ids_beyond_num_classes_are_a_config_error(d2, cfg):
    from detectron2.modeling import build_model

    from detr_peg.errors import ConfigError

    cfg.MODEL.META_ARCHITECTURE = "DetrPeg"
    cfg.MODEL.DETR_PEG.NUM_CLASSES = 2  # the inputs use ids 0..2
    model = build_model(cfg).train()
    with pytest.raises(ConfigError, match=r"NUM_CLASSES is 2 but the data has class id 2, outside 0\.\.1"):
        model(batched_inputs())


def write_image_dataset(root: Path) -> dict:
    from PIL import Image

    rng = np.random.default_rng(0)
    path = root / "image.png"
    Image.fromarray(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(path)
    return {
        "file_name": str(path),
        "height": 90,
        "width": 120,
        "image_id": 1,
        "annotations": [
            {"bbox": [10.0, 20.0, 50.0, 40.0], "bbox_mode": 1, "category_id": 2, "iscrowd": 0},
            {"bbox": [70.0, 10.0, 30.0, 60.0], "bbox_mode": 1, "category_id": 0, "iscrowd": 0},
            {"bbox": [0.0, 0.0, 120.0, 90.0], "bbox_mode": 1, "category_id": 1, "iscrowd": 1},
        ],
    }


@pytest.mark.parametrize("crop_prob", [0.0, 1.0])
def test_mapper_keeps_boxes(d2, cfg, tmp_path, crop_prob):
    from detectron2.structures import Instances

    cfg.INPUT.MIN_SIZE_TRAIN = (64,)
    cfg.INPUT.MAX_SIZE_TRAIN = 100
    cfg.INPUT.CROP.RESIZE_SHORTEST_EDGE = [80]
    cfg.INPUT.CROP.SIZE = (60, 70)
    cfg.INPUT.CROP.PROB = crop_prob
    record = write_image_dataset(tmp_path)
    mapper = d2.DetrPegDatasetMapper(cfg, is_train=True)
    out = mapper(record)
    assert "annotations" in record  # the dataset's dict is left alone
    image = out["image"]
    assert image.dtype == torch.uint8 and image.shape[0] == 3 and min(image.shape[1:]) == 64
    instances = out["instances"]
    assert isinstance(instances, Instances) and instances.image_size == tuple(image.shape[1:])
    h, w = instances.image_size
    boxes = instances.gt_boxes.tensor
    assert 1 <= len(instances) <= 2  # the crowd box is dropped; a crop may drop another
    assert (boxes >= 0).all() and (boxes[:, 0::2] <= w).all() and (boxes[:, 1::2] <= h).all()
    assert set(instances.gt_classes.tolist()) <= {0, 2}
    if crop_prob == 0.0:
        scale = w / 120  # the resize rounds the long side to whole pixels
        expected = {2: 50 * scale, 0: 30 * scale}  # box widths after the resize, flipped or not
        for box, cls in zip(boxes.tolist(), instances.gt_classes.tolist()):
            assert box[2] - box[0] == pytest.approx(expected[cls], rel=1e-4)

    test_out = d2.DetrPegDatasetMapper(cfg, is_train=False)(record)
    assert "instances" not in test_out and "annotations" not in test_out
    assert min(test_out["image"].shape[1:]) == cfg.INPUT.MIN_SIZE_TEST or max(test_out["image"].shape[1:]) == 1333


def test_optimizer_groups_and_full_model_clipping(d2, cfg):
    from detectron2.modeling import build_model

    from detr_peg.integrations.detectron2.solver import FullModelClippedAdamW

    cfg.MODEL.META_ARCHITECTURE = "DeformableDetrPeg"
    model = build_model(cfg)
    optimizer = d2.build_detr_peg_optimizer(cfg, model)
    assert isinstance(optimizer, FullModelClippedAdamW) and optimizer.max_norm == pytest.approx(0.1)
    lrs = {g["name"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == pytest.approx({"transformer": 1e-4, "backbone": 2e-5, "linear_proj": 1e-5})
    model.train()
    sum(model(batched_inputs()).values()).backward()
    optimizer.step()
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    assert total <= 0.1 + 1e-5


def test_training_script_trains_and_evaluates(d2, tmp_path, monkeypatch):
    """tools/train_detectron2.py: two DefaultTrainer iterations, then COCOEvaluator on a tiny dataset."""
    from detr_peg.data import generate_synthetic_coco

    data = generate_synthetic_coco(tmp_path / "data", num_train=4, num_val=2, image_size=64, progress=False)
    script = load_tool("tools/train_detectron2.py")
    monkeypatch.chdir(REPO_ROOT)
    overrides = [
        "MODEL.DEVICE",
        "cpu",
        "MODEL.META_ARCHITECTURE",
        "DetrPeg",
        "MODEL.DETR_PEG.OVERRIDES",
        str(SMALL),
        "MODEL.DETR_PEG.CONFIG_FILE",
        "",
        "MODEL.DETR_PEG.NUM_CLASSES",
        "4",
        "DATASETS.TRAIN",
        "('tiny_train',)",
        "DATASETS.TEST",
        "('tiny_val',)",
        "SOLVER.IMS_PER_BATCH",
        "2",
        "SOLVER.MAX_ITER",
        "2",
        "SOLVER.STEPS",
        "(1,)",
        "SOLVER.CHECKPOINT_PERIOD",
        "1000",
        "TEST.EVAL_PERIOD",
        "0",
        "DATALOADER.NUM_WORKERS",
        "0",
        "INPUT.MIN_SIZE_TRAIN",
        "(64,)",
        "INPUT.MAX_SIZE_TRAIN",
        "64",
        "INPUT.MIN_SIZE_TEST",
        "64",
        "INPUT.MAX_SIZE_TEST",
        "64",
        "INPUT.CROP.RESIZE_SHORTEST_EDGE",
        "[64]",
        "INPUT.CROP.SIZE",
        "(32, 48)",
        "OUTPUT_DIR",
        str(tmp_path / "out"),
    ]
    registrations = [
        "--register",
        "tiny_train",
        str(data.train_annotations),
        str(data.train_images),
        "--register",
        "tiny_val",
        str(data.val_annotations),
        str(data.val_images),
    ]
    config = str(REPO_ROOT / "configs" / "detectron2" / "Base-DetrPeg.yaml")
    args = script.build_parser().parse_args(["--config-file", config, *registrations, *overrides])
    script.main(args)
    assert (tmp_path / "out" / "model_final.pth").is_file()

    args = script.build_parser().parse_args(
        [
            "--config-file",
            config,
            "--eval-only",
            *registrations,
            *overrides,
            "MODEL.WEIGHTS",
            str(tmp_path / "out" / "model_final.pth"),
        ]
    )
    results = script.main(args)
    bbox = results["bbox"]
    assert {"AP", "AP50", "AP75"} <= set(bbox)
    assert all(np.isnan(v) or 0.0 <= v <= 100.0 for v in bbox.values())
