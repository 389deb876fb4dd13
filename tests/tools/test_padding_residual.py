"""tools/padding_residual.py: what padding changes in a model with exact masks, run as a script on a trained demo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torchvision import tv_tensors

from detr_peg.data.image_input import as_rgb_tensor
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.detector import Detector
from tests.conftest import run_python
from tests.tools.tool_module import load_tool, run_main

TOOL = "tools/padding_residual.py"


def test_the_tool_reports_the_largest_differences_of_the_padded_image(tiny_demo_dir: Path, tmp_path: Path) -> None:
    checkpoint, images = tiny_demo_dir / "run" / "checkpoint.pth", tiny_demo_dir / "data" / "val"
    out = tmp_path / "residual.json"
    proc = run_python(
        TOOL, "--checkpoint", str(checkpoint), "--images", str(images), "--count", "2", "--output", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads(out.read_text())
    # The same numbers computed here: each image padded to the stride multiple, then grown by a quarter of its
    # size (rounded up to the stride multiple) with zeros, True in the mask.
    detector = Detector.from_checkpoint(checkpoint, device="cpu")
    model, step = detector.model.eval(), detector.model.size_divisibility
    transform = build_eval_transforms(detector.config.data)
    border, inside, largest, logits, ratios, fractions = 0.0, 0.0, 0.0, 0.0, [], []
    files = sorted(images.iterdir())[:2]
    for path in files:
        x = transform(tv_tensors.Image(as_rgb_tensor(path, name=str(path))))[None]
        h, w = x.shape[-2:]
        x = F.pad(x, (0, -w % step, 0, -h % step))
        mask = torch.ones(1, *x.shape[-2:], dtype=torch.bool)
        mask[:, :h, :w] = False
        H, W = (-(-math.ceil(s * 1.25) // step) * step for s in x.shape[-2:])
        grown = F.pad(x, (0, W - x.shape[-1], 0, H - x.shape[-2]))
        grown_mask = F.pad(mask, (0, W - x.shape[-1], 0, H - x.shape[-2]), value=True)
        with torch.no_grad():
            (a,), (b,) = model.backbone(x), model.backbone(grown)  # the tiny demo model has one level
            d = (a - b[..., : a.shape[-2], : a.shape[-1]]).abs()
            border = max(border, d[..., -1, :].max().item(), d[..., :, -1].max().item())
            inside = max(inside, d[..., :-1, :-1].max().item())
            largest = max(largest, a.abs().max().item())
            own, padded = model(x, mask), model(grown, grown_mask)
            logits = max(logits, (own["pred_logits"] - padded["pred_logits"]).abs().max().item())
        ratios.append(padded["pred_boxes"][0] / own["pred_boxes"][0])  # [Q, 4] normalised cx, cy, w, h
        fractions.append([w / W, h / H])
    assert report["images"] == 2 and report["extra_padding"] == 0.25
    expected = {"border": border, "inside": inside, "largest_activation": largest}
    torch.testing.assert_close(report["levels"], [expected])
    torch.testing.assert_close(report["logits"], logits)
    medians = torch.cat(ratios).median(dim=0).values.tolist()
    assert report["boxes"]["median_ratio"] == dict(zip(("cx", "cy", "w", "h"), medians))
    assert report["boxes"]["canvas_fraction"] == dict(zip("xy", torch.tensor(fractions).median(dim=0).values.tolist()))
    assert 0.5 < report["boxes"]["canvas_fraction"]["x"] < 0.85  # a canvas a quarter larger, rounded up
    assert border > 0  # the padded canvas reaches the image's border cells


def test_bad_input_is_one_line_and_exit_2(tiny_demo_dir: Path, tmp_path: Path, capsys) -> None:
    # As a script, in a process of its own: one line, exit 2, nothing on stdout.
    proc = run_python(TOOL, "--checkpoint", str(tmp_path / "missing.pth"), "--images", str(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"padding_residual.py: --images {tmp_path / 'none'} is not a folder."]
    # The other inputs through main() in this process (the same code after the start-up).
    tool = load_tool(TOOL)
    for option, value in (("--extra", "nan"), ("--extra", "0"), ("--count", "0")):
        result = run_main(tool, capsys, "--checkpoint", "c.pth", "--images", str(tmp_path), option, value)
        assert result.returncode == 2 and result.stderr.startswith(f"padding_residual.py: error: argument {option}: ")
        assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    result = run_main(tool, capsys, "--checkpoint", str(tmp_path / "missing.pth"), "--images", str(tmp_path / "empty"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "holds no image" in result.stderr
    (tmp_path / "a.png").write_bytes(b"not a png")
    result = run_main(tool, capsys, "--checkpoint", str(tmp_path / "missing.pth"), "--images", str(tmp_path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "missing.pth" in result.stderr and "Traceback" not in result.stderr
    checkpoint = tiny_demo_dir / "run" / "checkpoint.pth"
    result = run_main(tool, capsys, "--checkpoint", str(checkpoint), "--images", str(tmp_path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "a.png") in result.stderr and "Traceback" not in result.stderr
    mine = tmp_path / "mine.json"  # the output follows every command's rules: a file of the user's is kept
    mine.write_text("my notes")
    result = run_main(tool, capsys, "--checkpoint", str(checkpoint), "--images", str(tmp_path / "empty"),
                      "--output", str(mine))  # fmt: skip
    assert result.returncode == 2 and result.stdout == "" and mine.read_text() == "my notes"
    assert result.stderr.strip().startswith(f"padding_residual.py: {mine} exists and was not written by detr-peg")
