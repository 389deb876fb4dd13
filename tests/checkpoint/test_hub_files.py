"""Model folders named by a local path or a Hugging Face Hub name (no network: the Hub is only named)."""

from __future__ import annotations

import pytest

from detr_peg.checkpoint.hub_files import is_hub_name, model_folder
from detr_peg.errors import CheckpointError


@pytest.mark.parametrize(
    ("spec", "hub"),
    [
        ("facebook/detr-resnet-50", True),
        ("SenseTime/deformable-detr-with-box-refine", True),
        ("facebook/detr-resnet-50@no_timm", True),
        ("owner/model.v2", True),
        ("detr-resnet-50", False),  # a repository id without its owner is not read as a Hub name
        ("runs/checkpoint.pth", False),  # a missing checkpoint file, not a repository
        ("configs/model.yaml", False),
        ("a/b/c", False),
        ("/abs/folder", False),
        ("./folder/x", False),
    ],
)
def test_what_is_a_hub_name(spec, hub):
    assert is_hub_name(spec) is hub


def test_a_local_folder_is_never_a_hub_name(tmp_path, monkeypatch):
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_name("owner/name")
    folder = model_folder("owner/name")
    assert folder.local is not None and folder.repo_id is None
    assert folder.file("config.json") is None


def test_a_hub_name_keeps_its_revision():
    folder = model_folder("facebook/detr-resnet-50@no_timm")
    assert (folder.local, folder.repo_id, folder.revision) == (None, "facebook/detr-resnet-50", "no_timm")


def test_neither_a_folder_nor_a_hub_name_is_one_sentence(tmp_path):
    with pytest.raises(CheckpointError, match="is neither a local model folder nor a Hugging Face Hub name"):
        model_folder(str(tmp_path / "missing"))


@pytest.mark.parametrize(("name", "reader"), [("model.onnx", "from_onnx"), ("checkpoint.pth", "from_checkpoint")])
def test_a_file_is_not_a_model_folder_and_its_reader_is_named(tmp_path, name: str, reader: str) -> None:
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / name} is a file, not a model folder: read it with "
                       rf"Detector\.{reader}\.$"):  # fmt: skip
        model_folder(tmp_path / name)


def test_a_training_run_folder_names_its_checkpoint(tmp_path) -> None:
    (tmp_path / "checkpoint.pth").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=rf"^{tmp_path} holds no config\.json; read its checkpoint with "
                       rf"Detector\.from_checkpoint\('{tmp_path}/checkpoint\.pth'\)\.$"):  # fmt: skip
        model_folder(tmp_path).first_file(["config.json"], "config.json")
