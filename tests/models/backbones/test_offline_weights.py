"""Backbone weights that cannot be downloaded: one line naming model.backbone.weights and what to set, exit 2.

The commands run with every download refused (an HTTP(S) proxy on a closed
local port, the Hugging Face Hub offline, an empty torch hub cache), so the
tests behave the same with and without network.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_python
from tests.reliability.conftest import ANNOTATIONS, IMAGES, write_dataset

NO_NETWORK = {
    "https_proxy": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "no_proxy": "",
    "NO_PROXY": "",
    "HF_HUB_OFFLINE": "1",
}

HINT = (
    "for model.backbone.weights ({reason}); without network, set model.backbone.weights to a local weights file "
    "(.pth or .safetensors, saved once where there is network) or to null for random initialisation."
)


def train_own_data(tmp_path: Path, *words: str):
    """``detr-peg train`` on a small dataset of one's own, as in the README, with downloads refused."""
    write_dataset(tmp_path)
    data = [
        f"data.{split}_{kind}={path}"
        for split in ("train", "val")
        for kind, path in (("images", IMAGES), ("annotations", ANNOTATIONS))
    ]
    return run_python(
        "-m",
        "detr_peg.cli.main",
        "train",
        *words,
        *data,
        "--output",
        "run",
        "train.epochs=1",
        "train.device=cpu",
        cwd=tmp_path,
        timeout=300,
        TORCH_HOME=str(tmp_path / "torch_home"),
        HF_HOME=str(tmp_path / "hf_home"),
        **NO_NETWORK,
    )


def test_torchvision_imagenet_weights_offline(tmp_path: Path) -> None:
    proc = train_own_data(tmp_path, "--config", "detr_r50_peg")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in proc.stderr
    assert line.startswith(
        "detr-peg train: error: Could not download torchvision's ImageNet weights of resnet50 "
        "(https://download.pytorch.org/models/resnet50-"
    )
    assert line.endswith(HINT.split("{reason}")[1]) and "URLError" in line
    assert len([text for text in proc.stderr.splitlines() if "error" in text.lower()]) == 1


def test_timm_pretrained_weights_offline(tmp_path: Path) -> None:
    proc = train_own_data(tmp_path, "--config", "timm/detr_timm_resnet50_peg", "model.backbone.weights=pretrained")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("detr-peg train: error: Could not download timm's pretrained weights of 'resnet50'")
    assert line.endswith(HINT.split("{reason}")[1])


@pytest.mark.parametrize("url", ["https://example.invalid/backbone.pth"])
def test_backbone_weights_url_offline(tmp_path: Path, url: str) -> None:
    proc = train_own_data(tmp_path, "--config", "detr_r50_peg", f"model.backbone.weights={url}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"detr-peg train: error: Could not download the backbone weights {url} for model.backbone.weights ("
    )
    assert line.endswith(HINT.split("{reason}")[1])
