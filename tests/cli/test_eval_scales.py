"""``detr-peg eval --scales / --canvas-scales / --padding`` on a tiny synthetic run.

The command runs in a subprocess as a user starts it; the JSON files are read
back and checked against metrics computed separately by plain ``detr-peg eval``
runs on the same images.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from detr_peg.checkpoint.format import read_checkpoint
from detr_peg.cli.main import main
from detr_peg.config import load_config
from detr_peg.engine.distributed import DistEnv
from detr_peg.engine.evaluation.coco_metrics import STAT_NAMES
from detr_peg.engine.evaluation.evaluate import merge_shards
from detr_peg.engine.evaluation.padding import predict_raw
from detr_peg.engine.evaluation.run import load_for_evaluation
from detr_peg.engine.evaluation.scales import check_scales
from detr_peg.engine.loader import build_eval_loader
from detr_peg.engine.training import run_training
from detr_peg.errors import ConfigError
from tests.cli_process import CliResult
from tests.conftest import CLI, run_python
from tests.engine.tiny_run import synthetic_data, synthetic_overrides, tiny_config


def _eval(*args: str) -> CliResult:
    return run_python(*CLI, "eval", *args, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-iteration DETR + PEG run on 64 px synthetic shapes (4 validation images)."""
    root = tmp_path_factory.mktemp("scales")
    data = synthetic_data(root / "data")
    cfg = tiny_config(
        synthetic_overrides(
            data,
            root / "run",
            "train.max_iters=2",
            "train.batch_size=4",
            "model.position.name=peg",
            "eval.batch_size=3",
        )
    )
    run_training(cfg, progress_bars=False)
    return root


@pytest.fixture(scope="module")
def evaluated(run: Path) -> Path:
    out = run / "eval"
    proc = _eval(
        "--checkpoint",
        str(run / "run" / "checkpoint.pth"),
        "--output",
        str(out),
        "--scales",
        "1,1.5",
        "--canvas-scales",
        "1.5",
        "--padding",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resized x1.5" in proc.stdout and "canvas  x1.5" in proc.stdout and "padding exact" in proc.stdout
    return out


def _metrics(path: Path) -> dict[str, float]:
    return json.loads(path.read_text())["bbox"]


def _check_metrics(metrics: dict) -> None:
    assert list(metrics) == list(STAT_NAMES)
    assert all(isinstance(v, float) and (v == -1.0 or 0.0 <= v <= 100.0) for v in metrics.values())


def test_resized_scales_equal_plain_evaluations(evaluated: Path, run: Path, tmp_path: Path) -> None:
    report = json.loads((evaluated / "scales_resized.json").read_text())
    assert report["kind"] == "resized" and report["base_size"] == 64
    assert [(r["scale"], r["size"], r["num_images"]) for r in report["results"]] == [(1.0, 64, 4), (1.5, 96, 4)]
    for entry in report["results"]:
        _check_metrics(entry["metrics"])
    # scale 1 is the ordinary evaluation, number for number
    assert report["results"][0]["metrics"] == _metrics(evaluated / "metrics.json")
    # scale 1.5 is an ordinary evaluation at 96 px (long side capped at 1.5 x 96)
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run / "run" / "checkpoint.pth"),
                "--output",
                str(tmp_path),
                "data.val_scale=96",
                "data.val_max_size=144",
            ]
        )
        == 0
    )
    assert report["results"][1]["metrics"] == _metrics(tmp_path / "metrics.json")


def test_canvas_scales_evaluate_a_generated_larger_canvas(evaluated: Path, run: Path, tmp_path: Path) -> None:
    report = json.loads((evaluated / "scales_canvas.json").read_text())
    assert report["kind"] == "canvas" and report["base_size"] == 64
    (entry,) = report["results"]
    assert (entry["scale"], entry["size"], entry["num_images"]) == (1.5, 96, 4)
    _check_metrics(entry["metrics"])
    canvas = run / "data" / "canvas_96"
    manifest = json.loads((canvas / "manifest.json").read_text())
    assert manifest["params"]["image_size"] == 96 and manifest["params"]["reference_size"] == 64
    annotations = json.loads((canvas / "annotations_val.json").read_text())
    assert {(img["width"], img["height"]) for img in annotations["images"]} == {(96, 96)}
    assert all(8 <= a["bbox"][2] <= 32 for a in annotations["annotations"])  # the 64 px set's object sides
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run / "run" / "checkpoint.pth"),
                "--output",
                str(tmp_path),
                f"data.val_images={canvas / 'val'}",
                f"data.val_annotations={canvas / 'annotations_val.json'}",
                "data.val_scale=96",
                "data.val_max_size=144",
            ]
        )
        == 0
    )
    assert entry["metrics"] == _metrics(tmp_path / "metrics.json")


def test_padding_report(evaluated: Path) -> None:
    report = json.loads((evaluated / "padding.json").read_text())
    modes = report["modes"]
    assert {name: m["batch_size"] for name, m in modes.items()} == {"mixed": 3, "single": 1, "exact": 3}
    for mode in modes.values():
        _check_metrics(mode["metrics"])
        assert mode["seconds"] > 0
    # every synthetic image has the same size, so the mixed batches get extra padding
    assert report["extra_padding"] == 0.25 and 0.3 < report["padded_fraction_mixed"] < 0.4
    assert report["default_mode"] == "mixed"
    # the backbone sees the padding; batches without padding give the single-image outputs
    assert report["max_abs_logit_diff_mixed_vs_single"] > 1e-3
    assert report["max_abs_logit_diff_exact_vs_single"] < 1e-4
    assert report["max_abs_box_diff_exact_vs_single"] < 1e-4


@pytest.mark.parametrize("extra", [0.5, 0.0])
def test_extra_padding_evaluates_in_the_padding_comparisons_grown_batches(
    run: Path, tmp_path: Path, extra: float
) -> None:
    """``eval.extra_padding``: the command's detections are those of the padding comparison's batches grown by the
    same fraction (its ``mixed`` mode, at 0.25 on these one-size images unless set), to the last digit; 0.5 and 0
    differ."""
    checkpoint = run / "run" / "checkpoint.pth"
    out = tmp_path / "out"
    proc = _eval("--checkpoint", str(checkpoint), "--output", str(out), "--padding", f"eval.extra_padding={extra}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "padding.json").read_text())["extra_padding"] == (extra or 0.25)
    written = json.loads((tmp_path / "out" / "detections.json").read_text())

    stored = read_checkpoint(checkpoint)
    cfg = stored.config
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    loaded, dataset, amp = load_for_evaluation(cfg, stored, env)
    loader = build_eval_loader(
        dataset, cfg.eval.batch_size, 0, env, size_divisibility=loaded.model.size_divisibility, padding_mode="mixed"
    )
    expected = {extra: predict_raw(loaded, loader, env.device, amp, extra)[0] for extra in (0.5, 0.0)}
    # Not on a terminal: progress is told in lines, the number of batches first and the last one done.
    assert (
        f"eval: {len(loader)} batches\n" in proc.stdout
        and f"eval: {len(loader)}/{len(loader)} batches\n" in proc.stdout
    )
    assert written == merge_shards([expected[extra]])[0]
    assert written != merge_shards([expected[0.5 if extra == 0 else 0.0]])[0]


def test_canvas_scales_need_a_synthetic_dataset(run: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "annotations_val.json"
    shutil.copy(run / "data" / "annotations_val.json", foreign)
    proc = _eval(
        "--checkpoint",
        str(run / "run" / "checkpoint.pth"),
        "--output",
        str(tmp_path / "eval"),
        "--canvas-scales",
        "2",
        f"data.val_annotations={foreign}",
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "--canvas-scales needs a synthetic dataset" in line and str(foreign) in line
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--scales", "1,x", "must be comma-separated positive numbers"),
        ("--canvas-scales", "0,2", "must be comma-separated positive numbers"),
        ("--canvas-scales", "0.25", "too small for the dataset's objects"),
        ("--scales", "1,1e308", "more than the 8192 px accepted"),
        ("--scales", "200", "gives images of up to"),
        ("--canvas-scales", "1e400", "must be comma-separated positive numbers"),
        ("--scales", "1,1.5,1.0", "argument --scales: gives the scale 1 twice ('1,1.5,1.0'); give each scale once"),
        ("--canvas-scales", "0.5,5e-1", "argument --canvas-scales: gives the scale 0.5 twice ('0.5,5e-1')"),
    ],
)
def test_bad_scales_are_one_line_errors(
    run: Path, tmp_path: Path, capsys, option: str, value: str, message: str
) -> None:
    args = ["eval", "--checkpoint", str(run / "run" / "checkpoint.pth"), "--output", str(tmp_path), option, value]
    assert main(args) == 2  # argparse's refusals of malformed lists too
    assert message in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()  # refused before the first evaluation


@pytest.mark.parametrize(
    ("scales", "canvas", "message"),
    [
        ((1.0, 1.5, 1.0), (), "--scales gives the scale 1 twice; give each scale once."),
        ((), (2.0, 2.0), "--canvas-scales gives the scale 2 twice; give each scale once."),
        ("2", (), "--scales must be a list or tuple of positive numbers, got '2'."),
        ((1.0, None), (), "--scales must be a list or tuple of positive numbers, got (1.0, None)."),
        ((), [True], "--canvas-scales must be a list or tuple of positive numbers, got [True]."),
    ],
)
def test_a_scale_given_twice_in_code_is_refused_by_check_scales(scales, canvas, message: str) -> None:
    """The check every evaluation runs (eval, study, the Python API), behind the command line's own."""
    data = load_config(None).data
    with pytest.raises(ConfigError) as info:
        check_scales(data, scales, canvas)
    assert str(info.value) == message
    check_scales(data, (1.0, 1.5), (1.5, 2.0))  # each once: accepted
