"""Shipped configs by name: the one resolver, and copies that load like the originals (every shipped config)."""

from __future__ import annotations

from pathlib import Path

import pytest

import detr_peg
from detr_peg.config.shipped import portable_text, resolve_config, shipped_config, shipped_names
from detr_peg.lab.study.study_file import load_study_file
from tests.conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"
DETR_PEG_CONFIGS = [n for n in shipped_names() if not n.startswith(("detectron2/", "study/"))]
STUDIES = [n for n in shipped_names() if n.startswith("study/")]


def test_the_names_are_the_files_of_the_top_level_configs_folder() -> None:
    assert shipped_names() == sorted(p.relative_to(CONFIGS).with_suffix("").as_posix() for p in CONFIGS.rglob("*.yaml"))
    for spelling in ("detr_r50_peg", "detr_r50_peg.yaml", "configs/detr_r50_peg.yaml", "configs/detr_r50_peg"):
        assert shipped_config(spelling) == CONFIGS / "detr_r50_peg.yaml", spelling
    for outside in ("../pyproject", "/etc/passwd", "", "study/../../pyproject", "nope"):
        assert shipped_config(outside) is None, outside


def test_a_file_wins_over_a_name_a_folder_does_not_and_a_missing_one_is_returned_as_given(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_config("demo") == CONFIGS / "demo.yaml"
    (tmp_path / "demo").mkdir()  # a folder (the demo's own output, say) does not hide the name
    assert resolve_config("demo") == CONFIGS / "demo.yaml"
    assert resolve_config(".") == Path(".")
    (tmp_path / "demo").rmdir()
    (tmp_path / "demo").write_text("model: {}\n")
    assert resolve_config("demo") == Path("demo")
    assert resolve_config("missing.yaml") == Path("missing.yaml")
    assert resolve_config("../base/coco.yaml", relative_to=CONFIGS / "timm") == CONFIGS / "timm/../base/coco.yaml"


@pytest.mark.parametrize("name", DETR_PEG_CONFIGS)
def test_a_copy_outside_the_package_loads_like_the_shipped_config(name: str, tmp_path: Path) -> None:
    copy = tmp_path / "copy.yaml"
    copy.write_text(portable_text(shipped_config(name)))
    assert detr_peg.load_config(copy) == detr_peg.load_config(name) == detr_peg.load_config(CONFIGS / f"{name}.yaml")


@pytest.mark.parametrize("name", STUDIES)
def test_a_copied_study_names_the_shipped_configs(name: str, tmp_path: Path) -> None:
    copy = tmp_path / "study.yaml"
    copy.write_text(portable_text(shipped_config(name)))
    assert load_study_file(copy).configs == load_study_file(name).configs
    assert all(Path(c).is_relative_to(CONFIGS.resolve()) for c in load_study_file(copy).configs)
