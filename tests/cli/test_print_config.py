"""``detr-peg train --print-config`` states the paper's recipe for each of its five configs."""

from __future__ import annotations

import pytest
import yaml

from detr_peg.cli.main import main
from tests.conftest import REPO_ROOT

PAPER_CONFIGS = [
    "detr_r50_sine",
    "detr_r50_none",
    "detr_r50_peg",
    "deformable_detr_r50_sine",
    "deformable_detr_r50_peg",
]


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_print_config_shows_the_recipe(name: str, capsys, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    status = main(["train", "--config", str(REPO_ROOT / "configs" / f"{name}.yaml"), "--print-config"])
    assert status == 0
    text = capsys.readouterr().out
    cfg = yaml.safe_load(text)
    t = cfg["train"]
    assert (t["epochs"], t["lr_drop"], t["lr_gamma"]) == (50, 40, 0.1)
    assert (t["lr"], t["lr_backbone"], t["weight_decay"], t["clip_max_norm"]) == (1e-4, 2e-5, 1e-4, 0.1)
    assert (t["batch_size"], t["total_batch_size"]) == (4, 32)
    assert cfg["model"]["position"]["name"] == name.rsplit("_", 1)[1]
    assert cfg["model"]["arch"] == ("deformable_detr" if name.startswith("deformable") else "detr")
    assert "# recipe: AdamW, lr 0.0001 (backbone 2e-05), weight decay 0.0001" in text
    assert "# schedule: 50 epochs, StepLR x0.1 every 40 epochs" in text
    assert "# batch: 4 per process x 1 process = total 4 (the recipe's total is 32: 8 processes, torchrun" in text
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert main(["train", "--config", str(REPO_ROOT / "configs" / f"{name}.yaml"), "--print-config"]) == 0
    assert "# batch: 4 per process x 8 processes = total 32\n" in capsys.readouterr().out


def test_print_config_states_the_iteration_budget(capsys) -> None:
    assert main(["train", "--config", "demo", "--print-config", "train.max_iters=7"]) == 0
    assert "; ends after 7 iterations (train.max_iters)\n" in capsys.readouterr().out


def test_print_config_applies_overrides_and_reads_no_data(capsys, tmp_path) -> None:
    status = main(
        [
            "train",
            "--config",
            str(REPO_ROOT / "configs" / "detr_r50_peg.yaml"),
            "--print-config",
            "--output",
            str(tmp_path / "run"),
            "train.batch_size=2",
            "data.train_images=/does/not/exist",
        ]
    )
    assert status == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["train"]["batch_size"] == 2 and cfg["train"]["output_dir"] == str(tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override", ["model.backbone.out_stages=[3,2]", "data.crop_size=[600,384]", "train.device=gpu"]
)
def test_print_config_refuses_what_training_would_refuse(override: str, capsys) -> None:
    """A list in the wrong order or a device that is none is refused when the config is read: never printed."""
    assert main(["train", "--config", "demo", override, "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"'{override.split('=')[0]}' must be" in err


def test_the_printed_config_is_a_config_file_with_its_notes_as_comments(capsys, tmp_path) -> None:
    """Reading demo under another encoding leaves its PEG options out with a note: a comment, not a YAML error."""
    assert main(["train", "--config", "demo", "--print-config", "model.position.name=sine"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# ") and "left out 'model.position.peg_layers'" in printed.splitlines()[0]
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)
    assert main(["train", "--config", str(saved), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(printed)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.position.peg_kernel=2", "model.position.peg_kernel must be a positive odd number, got 2."),
        (
            "model.backbone.out_stages=[9]",
            "model.backbone.out_stages must be ascending stage numbers in 1..4, got [9].",
        ),
        ("model.backbone.out_stages=[3,4]", "model.backbone.out_stages is [3, 4], but DETR takes one stage"),
        ("model.backbone.frozen_stages=9", "model.backbone.frozen_stages=9: resnet50 has 4 stages"),
        ("model.arch=deformable_detr model.two_stage=true", "model.two_stage needs model.with_box_refine=true"),
        ("model.backbone.name=timm:resnet18", "set model.backbone.source=timm and model.backbone.name=resnet18."),
        ("loss.ce_loss_coef=0 loss.bbox_loss_coef=0 loss.giou_loss_coef=0", "giou_loss_coef are all 0; at least one"),
    ],
)
def test_print_config_refuses_what_train_refuses_when_it_builds_the_model(capsys, override, message) -> None:
    """Checked by building the model on the meta device: no memory, no weights read."""
    args = ["--config", "detr_r50_peg", "model.position.name=peg", *override.split()]
    assert main(["train", *args, "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and captured.err.count("\n") == 1


def test_print_config_of_the_advised_timm_backbone_passes(capsys) -> None:
    args = ["--config", "demo", "model.backbone.source=timm", "model.backbone.name=resnet18", "--print-config"]
    assert main(["train", *args]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["backbone"]["name"] == "resnet18"
