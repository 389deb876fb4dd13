"""A checkpoint of a format version this release cannot read is refused in one sentence, ``.pth`` and
``.safetensors`` alike (safetensors metadata holds the version as text)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from detr_peg.checkpoint.format import read_checkpoint, save_checkpoint
from detr_peg.config import load_config
from detr_peg.errors import CheckpointError


def _written(folder: Path, suffix: str) -> Path:
    path = folder / f"model{suffix}"
    cfg = load_config(None, ["model.num_classes=2"])
    save_checkpoint(path, cfg, {"w": torch.ones(2)}, None)
    return path


@pytest.mark.parametrize("version", ["99", "0", "one", None])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_another_format_version_is_refused(tmp_path: Path, suffix: str, version: str | None) -> None:
    path = _written(tmp_path, suffix)
    read_checkpoint(path)  # as written: read
    if suffix == ".pth":
        obj = torch.load(path, weights_only=True)
        obj["format_version"] = int(version) if version and version.isdigit() else version
        torch.save(obj, path)
        shown = repr(obj["format_version"])
    else:
        with safe_open(str(path), "pt") as handle:
            tensors, metadata = {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()  # noqa: SIM118
        metadata = {k: v for k, v in metadata.items() if k != "format_version"}
        save_file(tensors, str(path), metadata={**metadata, **({} if version is None else {"format_version": version})})
        shown = repr(version)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(path)
    assert str(err.value) == f"{path} has format_version {shown}; this detr_peg reads versions 1 to 1."
