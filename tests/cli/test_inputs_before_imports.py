"""A missing or wrong input named on the command line is refused before torch is imported.

Importing torch, torchvision and the models takes seconds; a typo in a path
should not. Each case runs in a fresh interpreter (nothing imported yet) and
checks the one-line message, exit status 2, that ``torch`` was never
imported, and that nothing was written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import main_in_fresh_interpreter

MISSING_CONFIG = (
    "Config file no/such.yaml does not exist, and no shipped config has that name (detr-peg configs list shows them)."
)

CASES = [
    (["train", "--config", "no/such.yaml"], MISSING_CONFIG),
    (["eval", "--checkpoint", "no/such.pth"], "The checkpoint file no/such.pth does not exist."),
    (["eval", "--checkpoint", "folder"], "The checkpoint file folder is a folder, not a file."),
    (["eval", "--checkpoint", "model.pth", "--config", "no/such.yaml"], MISSING_CONFIG),
    (["predict", "--checkpoint", "no/such.pth", "picture.png"], "The checkpoint file no/such.pth does not exist."),
    (["predict", "--onnx", "no/such.onnx", "picture.png"], "The ONNX model file no/such.onnx does not exist."),
    (["predict", "--checkpoint", "model.pth", "no/such.png"], "Input no/such.png does not exist."),
    (
        ["predict", "--checkpoint", "model.pth", "folder"],
        "Folder folder holds no image files (.jpg, .jpeg, .png, .bmp, .webp, .tif, .tiff, .gif).",
    ),
    (
        ["export", "--checkpoint", "no/such.pth", "--output", "m.onnx"],
        "The checkpoint file no/such.pth does not exist.",
    ),
    (["convert", "no/such.pth", "out.pth"], "The official checkpoint file no/such.pth does not exist."),
    (["convert", "model.pth", "out.pth", "--config", "no/such.yaml"], MISSING_CONFIG),
    (["study", "--study", "no/such.yaml", "--output", "s"], "Study file no/such.yaml does not exist."),
    (["study", "--config", "no/such.yaml", "--output", "s"], MISSING_CONFIG.replace("no/", "{tmp}/no/")),
    (["study", "--config", "folder", "--output", "s"], "Config file {tmp}/folder is a folder, not a file."),
    (["eval", "--checkpoint", ""], "--checkpoint is empty (''); give a value (see detr-peg eval --help)"),
    (["train", "--config", ""], "--config is empty (''); give a value (see detr-peg train --help)"),
    (  # ONNX Runtime reads local files only
        ["predict", "--onnx", "https://example.invalid/m.onnx", "picture.png"],
        "The ONNX model file https://example.invalid/m.onnx does not exist.",
    ),
]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("argv, message", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_input_path_is_refused_before_torch_is_imported(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "model.pth").write_bytes(b"not read: the other input is refused first")
    (tmp_path / "picture.png").write_bytes(b"not read either")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("no image here\n")
    before = _files(tmp_path)
    proc, probe = main_in_fresh_interpreter(*argv, cwd=tmp_path)  # nothing imported before the command
    assert probe == {"status": 2, "heavy": []} and proc.stdout == "", proc.stdout + proc.stderr[-2000:]
    message = message.replace("{tmp}", str(tmp_path))  # study makes its config paths absolute
    assert proc.stderr.strip().splitlines() == [f"detr-peg {argv[0]}: error: {message}"]
    assert _files(tmp_path) == before
