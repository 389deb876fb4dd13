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
