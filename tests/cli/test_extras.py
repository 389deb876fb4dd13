"""Optional dependencies: a tool run without its package prints one line naming what to install, exit 2."""

from __future__ import annotations

import importlib.util

import pytest

from detr_peg.messages import install_hint
from tests.conftest import REPO_ROOT, run_python

#: tools/ scripts -> the optional packages they cannot start without.
TOOL_NEEDS = {"tools/train_detectron2.py": "detectron2"}


def run_without(module: str, script: str, *args: str):
    """Run ``script`` as ``python script args`` with ``module`` absent (blocked when it is installed)."""
    code = (
        "import runpy, sys\n"
        f"sys.modules[{module!r}] = None  # absent, as when it is not installed\n"
        f"sys.argv = [{script!r}, *{list(args)!r}]\n"
        f"runpy.run_path({script!r}, run_name='__main__')\n"
    )
    return run_python("-c", code, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["--config-file", "configs/detectron2/detr_r50_peg_coco.yaml"]])
@pytest.mark.parametrize("script", sorted(TOOL_NEEDS))
def test_a_tool_without_its_optional_package_says_what_to_install(script: str, args: list[str]) -> None:
    module = TOOL_NEEDS[script]
    proc = run_without(module, script, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{script}: error: {module} is not installed; install it with {install_hint(module)}."
    ]


@pytest.mark.skipif(importlib.util.find_spec("detectron2") is not None, reason="detectron2 is installed here")
def test_train_detectron2_help_without_detectron2_installed() -> None:
    proc = run_python("tools/train_detectron2.py", "--help", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "tools/train_detectron2.py: error: detectron2 is not installed; install it with "
        "pip install 'git+https://github.com/facebookresearch/detectron2.git' (it is not on PyPI)."
    ]


@pytest.mark.parametrize("module", ["matplotlib", "submitit", "onnxruntime", "tensorboard"])
def test_the_extra_of_each_optional_package(module: str) -> None:
    code = f"import sys\nsys.modules[{module!r}] = None\nfrom detr_peg.cli.extras import require\nrequire('tools/x.py', {module!r})\n"
    proc = run_python("-c", code, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    how = {
        "matplotlib": "pip install matplotlib submitit (the 'study' extra of detr_peg)",
        "submitit": "pip install matplotlib submitit (the 'study' extra of detr_peg)",
        "onnxruntime": "pip install onnx onnxscript onnxruntime (the 'onnx' extra of detr_peg)",
        "tensorboard": "pip install tensorboard (the 'tensorboard' extra of detr_peg)",
    }[module]  # installable from a wheel or a checkout: the packages by name, not detr_peg[extra]
    assert line == f"tools/x.py: error: {module} is not installed; install it with {how}."


def test_the_hints_name_the_packages_of_the_extras_pyproject_declares() -> None:
    import re

    from detr_peg.messages import extras

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras() == {
        extra: tuple(re.split(r"[<>=!~\\[ ]", p)[0] for p in packages) for extra, packages in declared.items()
    }


def test_every_tool_starts_or_names_its_extra() -> None:
    """Each script of tools/ answers --help (with everything of the dev extra installed): none is forgotten."""
    for script in sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "tools").glob("*.py")):
        if script in TOOL_NEEDS and importlib.util.find_spec(TOOL_NEEDS[script]) is None:
            continue
        proc = run_python(script, "--help", timeout=120)
        assert proc.returncode == 0, f"{script}: {proc.stderr[-1500:]}"


def test_a_study_on_submitit_jobs_without_submitit_writes_nothing(tmp_path) -> None:
    code = (
        "import sys\nsys.modules['submitit'] = None\nfrom detr_peg.cli.main import main\n"
        "sys.exit(main(['study', '--config', 'demo', '--grid', 'model.position.name=sine,peg', '--submitit-local', "
        f"'--output', {str(tmp_path / 'st')!r}]))\n"
    )
    proc = run_python("-c", code, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"detr-peg study: error: --slurm and --submitit-local need submitit: {install_hint('submitit')}."
    ]
    assert not (tmp_path / "st").exists()
