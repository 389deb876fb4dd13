"""Rule: the public Python API refuses what it cannot use, before computing, naming the argument.

The detectors (both architectures), the post-processors, the criteria and
the builders raise ``TypeError`` or ``ValueError`` whose message names the
argument; a call that would once have returned results for the wrong images
(one size for two images, one target for two images) is refused too.
"""

from __future__ import annotations

import pytest
import torch

from detr_peg import build_model, load_config
from detr_peg.errors import ConfigError
from detr_peg.models.builder import build_criterion, build_postprocessor
from tests.engine.tiny_run import TINY_MODEL

ARCHS = ["detr", "deformable_detr"]


def _config(arch: str):
    return load_config(
        None, [*TINY_MODEL, f"model.arch={arch}", "model.num_classes=3", "model.backbone.out_stages=[2]"]
    )


@pytest.fixture(scope="module", params=ARCHS)
def parts(request):
    cfg = _config(request.param)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    return cfg, model, build_postprocessor(cfg), build_criterion(cfg)


GOOD = torch.rand(2, 3, 64, 128)  # a multiple of the coarsest stride: a list needs no padding either
BAD_IMAGES = {
    "uint8 pixels": (lambda: (GOOD * 255).to(torch.uint8), TypeError, "floating point"),
    "float64": (lambda: GOOD.double(), TypeError, "float64"),
    "1 channel": (lambda: GOOD[:, :1], ValueError, "3 colour channels"),
    "4 channels": (lambda: torch.cat([GOOD, GOOD[:, :1]], 1), ValueError, "3 colour channels"),
    "HWC layout": (lambda: GOOD.permute(0, 2, 3, 1), ValueError, "3 colour channels"),
    "no batch dimension": (lambda: GOOD[0], ValueError, "a batch of images of 3 colour channels"),
    "empty batch": (lambda: GOOD[:0], ValueError, "at least one image"),
    "zero width": (lambda: GOOD[..., :0], ValueError, "at least one image"),
    "NaN pixel": (
        lambda: GOOD.clone().index_put_((torch.tensor([1]),) * 4, torch.tensor(float("nan"))),
        ValueError,
        "NaN",
    ),
    "infinite pixel": (lambda: GOOD.clone().fill_(float("inf")), ValueError, "NaN or infinite"),
    "a NumPy array": (lambda: GOOD.numpy(), TypeError, "images must be"),
    "empty list": (lambda: [], ValueError, "empty list"),
    "list of HWC images": (lambda: [GOOD[0].permute(1, 2, 0)], ValueError, "images[0] must be a Tensor[3, H, W]"),
    "list of mixed dtypes": (lambda: [GOOD[0], GOOD[1].half()], TypeError, "mixes dtypes"),
    "list of uint8 images": (lambda: [(GOOD[0] * 255).to(torch.uint8)], TypeError, "floating point"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_the_detectors_refuse_images_they_cannot_use(parts, case: str) -> None:
    _, model, _, _ = parts
    make, error, fragment = BAD_IMAGES[case]
    with pytest.raises(error, match="images") as info, torch.no_grad():
        model(make())
    assert fragment in str(info.value)


def test_good_images_still_run_as_a_batch_and_as_a_list(parts) -> None:
    _, model, _, _ = parts
    with torch.no_grad():
        batched = model(GOOD)
        listed = model([GOOD[0], GOOD[1]])
    torch.testing.assert_close(batched["pred_logits"], listed["pred_logits"])
    torch.testing.assert_close(batched["pred_boxes"], listed["pred_boxes"])


BAD_SIZES = {
    "one size for two images": (torch.tensor([[64, 128]]), ValueError, "target_sizes describes 1 images"),
    "three sizes for two images": (torch.tensor([[64, 128]] * 3), ValueError, "target_sizes describes 3 images"),
    "sizes as a flat tensor": (torch.tensor([64, 128]), ValueError, "target_sizes must be a Tensor[B, 2]"),
    "sizes as a list": ([[64, 128], [64, 128]], ValueError, "target_sizes must be a Tensor[B, 2]"),
    "a zero height": (torch.tensor([[64, 128], [0, 128]]), ValueError, "must be positive (height, width) in pixels"),
    "a negative width": (torch.tensor([[64, -1], [64, 128]]), ValueError, "got [[64, -1], [64, 128]]"),
}


@pytest.mark.parametrize("case", list(BAD_SIZES))
def test_the_postprocessor_needs_one_size_per_image(parts, case: str) -> None:
    _, model, postprocessor, _ = parts
    with torch.no_grad():
        outputs = model(GOOD)
    sizes, error, fragment = BAD_SIZES[case]
    with pytest.raises(error) as info:
        postprocessor(outputs, sizes)
    assert fragment in str(info.value)


def _target(n: int = 1) -> dict:
    return {"labels": torch.zeros(n, dtype=torch.int64), "boxes": torch.full((n, 4), 0.5)}


BAD_TARGETS = {
    "one target for two images": (lambda: [_target()], ValueError, "targets describes 1 images"),
    "a dict instead of a list": (lambda: _target(), TypeError, "targets must be a list"),
    "float labels": (lambda: [_target(), {**_target(), "labels": torch.zeros(1)}], ValueError, "targets[1]['labels']"),
    "boxes of 5 numbers": (
        lambda: [_target(), {**_target(), "boxes": torch.zeros(1, 5)}],
        ValueError,
        "targets[1]['boxes']",
    ),
    "boxes and labels disagree": (
        lambda: [_target(2), {**_target(), "boxes": torch.zeros(3, 4)}],
        ValueError,
        "Tensor[1, 4]",
    ),
    "no boxes key": (
        lambda: [_target(), {"labels": torch.zeros(1, dtype=torch.int64)}],
        ValueError,
        "targets[1]['boxes']",
    ),
    # DETR would train label 3 of 3 classes as "no object", and the other cases fail by indexing.
    **{
        f"label {label}": (
            lambda label=label: [_target(2), {**_target(2), "labels": torch.tensor([0, label])}],
            ValueError,
            f"targets[1]['labels'] must lie in 0..2 (num_classes 3), got [0, {label}]",
        )
        for label in (3, 4, -1)
    },
    "boxes in pixels (x0, y0, x1, y1)": (
        lambda: [_target(), {**_target(), "boxes": torch.tensor([[10.0, 20.0, 50.0, 60.0]])}],
        ValueError,
        "targets[1]['boxes'] must be normalised (cx, cy, w, h), each from 0 to 1 (w, h >= 0), got [[10.0, 20.0",
    ),
    "a negative width": (
        lambda: [{**_target(), "boxes": torch.tensor([[0.5, 0.5, -0.25, 0.25]])}, _target()],
        ValueError,
        "targets[0]['boxes'] must be normalised",
    ),
}


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_the_criterion_needs_one_valid_target_per_image(parts, case: str) -> None:
    _, model, _, criterion = parts
    outputs = model(GOOD)
    make, error, fragment = BAD_TARGETS[case]
    with pytest.raises(error) as info:
        criterion(outputs, make())
    assert fragment in str(info.value)


@pytest.mark.parametrize("builder", [build_model, build_criterion, build_postprocessor])
@pytest.mark.parametrize("cfg", [None, {"model": {"arch": "detr"}}, "configs/detr_r50_peg.yaml"])
def test_the_builders_need_a_config_object(builder, cfg) -> None:
    with pytest.raises(TypeError, match=r"^cfg must be a detr_peg Config \(detr_peg.load_config\(...\)\), got "):
        builder(cfg)


@pytest.mark.parametrize(("builder", "section"), [(build_criterion, "loss"), (build_postprocessor, "eval")])
def test_the_loss_and_postprocessor_builders_need_the_whole_config(builder, section) -> None:
    model_section = load_config("demo", ["model.num_classes=3"]).model
    build_model(model_section)  # the model's builder takes the section alone
    with pytest.raises(TypeError, match=rf"^cfg must be the whole detr_peg Config \(this builder reads cfg.{section}"):
        builder(model_section)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("4", "must be an integer, got '4'"),
        (2.5, "must be an integer"),
        (True, "must be an integer"),
        (0, "must be in [1, 100000], got 0"),
        (10**12, "must be in [1, 100000]"),
    ],  # fmt: skip
)
def test_evaluate_checks_its_batch_size_as_the_config_does(value, words: str, tmp_path) -> None:
    from detr_peg import Detector
    from detr_peg.errors import ConfigError

    detector = Detector.from_config(_config("detr"), device="cpu")
    with pytest.raises(ConfigError) as err:
        detector.evaluate(tmp_path, tmp_path / "annotations.json", batch_size=value)
    message = str(err.value)
    assert message.startswith(f"evaluate: 'eval.batch_size' {words}") and message.endswith(".") and "\n" not in message


@pytest.mark.parametrize("loaded", [None, "model.pth", {"model": None}])
def test_a_detector_is_built_from_a_loaded_model_only(loaded) -> None:
    from detr_peg import Detector

    with pytest.raises(
        TypeError, match=r"^Detector\(\.\.\.\) takes a LoadedModel, got \w+; use Detector.from_checkpoint"
    ):
        Detector(loaded)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:"])
def test_a_device_that_is_no_device_is_one_sentence_wherever_cuda_is(device: str) -> None:
    from detr_peg import Detector
    from detr_peg.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        Detector.from_config(_config("detr"), device=device)
    assert str(err.value) == f"device is {device!r}; valid are 'auto', 'cpu', 'cuda' and 'cuda:N'."


@pytest.mark.parametrize("arch", ARCHS)
def test_models_are_built_in_float32_whatever_the_default_dtype(arch: str) -> None:
    cfg = _config(arch)
    torch.manual_seed(0)
    expected = build_model(cfg).state_dict()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = build_model(cfg)
        assert torch.get_default_dtype() == torch.float64  # the caller's choice is restored
    finally:
        torch.set_default_dtype(previous)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)  # dtypes included
    with torch.no_grad():
        assert model.eval()(GOOD)["pred_boxes"].dtype == torch.float32


def _padded_mask() -> torch.Tensor:
    mask = torch.zeros(2, 64, 128, dtype=torch.bool)
    mask[1, 48:], mask[1, :, 96:] = True, True  # the second image is 48 x 96, padded at the bottom and right
    return mask


def _empty_second_image() -> torch.Tensor:
    mask = _padded_mask()
    mask[1] = True
    return mask


@pytest.mark.parametrize(("make", "index"), [(lambda: ~_padded_mask(), 0), (_empty_second_image, 1)])
def test_a_mask_that_pads_the_top_left_pixel_is_refused(parts, make, index) -> None:
    """True = padding, at the bottom and right: an inverted mask (or an image of no pixel) is certain to be wrong."""
    _, model, _, _ = parts
    with pytest.raises(ValueError, match=rf"^mask\[{index}\] marks its top-left pixel as padding, but True = padding"):
        model(GOOD, make())
    with torch.no_grad():
        assert torch.isfinite(model(GOOD, _padded_mask())["pred_logits"]).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("keys", "says"),
    [(["loss.ce_loss_coef", "loss.bbox_loss_coef", "loss.giou_loss_coef"], "ce_loss_coef, bbox_loss_coef and giou"),
     (["loss.set_cost_class", "loss.set_cost_bbox", "loss.set_cost_giou"], "set_cost_class, set_cost_bbox and set")],
    ids=["loss-coefficients", "matcher-costs"],
)  # fmt: skip
def test_a_loss_that_cannot_train_is_refused(arch: str, keys: list[str], says: str) -> None:
    """All coefficients 0: the loss is 0 whatever the model predicts (training ran at loss 0.0 without a word)."""
    cfg = load_config(None, [*TINY_MODEL, f"model.arch={arch}", "model.num_classes=3", *(f"{k}=0" for k in keys)])
    with pytest.raises(ConfigError, match=rf"^loss.{says}.* are all 0; at least one must be non-zero.$"):
        build_criterion(cfg)
    build_criterion(load_config(None, [*TINY_MODEL, f"model.arch={arch}", "model.num_classes=3", f"{keys[0]}=0"]))
