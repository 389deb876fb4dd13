"""`detr-peg configs list|copy`, shipped config names for --config from any folder, and `detr-peg --version`."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, run_python

CLI = ("-m", "detr_peg.cli.main")


def test_version_is_the_distribution_version(tmp_path: Path) -> None:
    proc = run_python(*CLI, "--version", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"detr-peg {importlib.metadata.version('detr_peg')}"


def test_configs_list_names_every_shipped_config(tmp_path: Path) -> None:
    proc = run_python(*CLI, "configs", "list", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names = {
        p.relative_to(REPO_ROOT / "configs").with_suffix("").as_posix() for p in REPO_ROOT.glob("configs/**/*.yaml")
    }
    listed = {line.split()[0] for line in proc.stdout.splitlines()[1:]}
    assert listed == names
    assert "detr_r50_peg  " in proc.stdout and "DETR-R50, positional encoding: peg" in proc.stdout


def test_configs_copy_writes_a_copy_that_loads_like_the_original_and_refuses_to_overwrite(tmp_path: Path) -> None:
    proc = run_python(*CLI, "configs", "copy", "timm/detr_timm_resnet50_peg", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    copy = tmp_path / "detr_timm_resnet50_peg.yaml"
    assert yaml.safe_load(copy.read_text())["_base_"] == ["base/detr_r50", "base/coco", "base/paper_recipe"]

    code = (
        "import detr_peg\n"
        "a = detr_peg.load_config('detr_timm_resnet50_peg.yaml')\n"
        "b = detr_peg.load_config('timm/detr_timm_resnet50_peg')\n"
        "assert a == b, (a, b)\n"
        "print('SAME')\n"
    )
    same = run_python("-c", code, cwd=tmp_path, timeout=120)
    assert same.returncode == 0 and same.stdout.strip() == "SAME", same.stderr[-2000:]

    copy.write_text("# my edits\n")
    again = run_python(*CLI, "configs", "copy", "timm/detr_timm_resnet50_peg", cwd=tmp_path, timeout=60)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        "detr-peg configs: error: detr_timm_resnet50_peg.yaml already exists and is not overwritten; "
        "give another DEST or move the file away first."
    ]
    assert copy.read_text() == "# my edits\n"
    # DEST ending in a slash names a folder: refused while it is missing, not written as a file of that name.
    slash = run_python(*CLI, "configs", "copy", "demo", "newdir/", cwd=tmp_path, timeout=60)
    assert slash.returncode == 2 and not (tmp_path / "newdir").exists()
    assert slash.stderr.strip().splitlines() == [
        "detr-peg configs: error: The folder newdir of DEST does not exist; create it or give another DEST."
    ]


def test_configs_copy_of_a_study_names_its_configs_by_shipped_name(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    proc = run_python(*CLI, "configs", "copy", "study/proxy_synthetic", "mine", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    study = yaml.safe_load((tmp_path / "mine" / "proxy_synthetic.yaml").read_text())
    assert study["configs"] == ["proxy/deformable_small", "proxy/detr_small"]
    plan = run_python(
        *CLI, "study", "--study", "mine/proxy_synthetic.yaml", "--output", "s", "--plan", cwd=tmp_path, timeout=120
    )
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert str(REPO_ROOT / "configs" / "proxy" / "detr_small.yaml") in plan.stdout


def test_configs_copy_of_an_unknown_name_lists_the_valid_ones(tmp_path: Path) -> None:
    proc = run_python(*CLI, "configs", "copy", "detr_r51", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("detr-peg configs: error: No shipped config is named 'detr_r51': valid are base/coco, ")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["detr_r50_peg", "detr_r50_peg.yaml", "configs/detr_r50_peg.yaml"])
def test_config_by_shipped_name_from_another_folder(tmp_path: Path, name: str) -> None:
    proc = run_python(*CLI, "train", "--config", name, "--print-config", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "arch: detr\n" in proc.stdout and "name: peg\n" in proc.stdout, proc.stdout


def test_a_local_file_wins_over_a_shipped_name(tmp_path: Path) -> None:
    (tmp_path / "demo.yaml").write_text("model:\n  arch: detr\n  position:\n    name: learned\n")
    proc = run_python(*CLI, "train", "--config", "demo.yaml", "--print-config", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "name: learned\n" in proc.stdout


def test_a_config_that_is_neither_file_nor_name_is_one_line(tmp_path: Path) -> None:
    proc = run_python(*CLI, "train", "--config", "detr_r51", "--print-config", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "detr-peg train: error: Config file detr_r51 does not exist, and no shipped config has that name "
        "(detr-peg configs list shows them)."
    ]
