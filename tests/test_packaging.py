"""The package as users get it: the sdist and the wheel built from it, installed in a fresh environment.

The sdist is built from a copy of the source tree (so the checkout gets no
``build/`` folder) and the wheel from the sdist, as ``python -m build`` does.
The wheel goes into a new virtual environment, and its commands run from a
folder outside the checkout, with no ``PYTHONPATH``. To stay fast and offline
the environment installs the wheel alone (``--no-deps``) and sees the
dependencies of the running environment through a ``.pth`` file; the test
checks that ``detr_peg`` itself comes from the new environment.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

#: Left out of the copy the sdist is built from: what building, testing and running leave behind.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", "outputs", "studies", ".pytest_cache"
)


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from it: {"sdist": ..., "wheel": ...}."""
    root = tmp_path_factory.mktemp("build")
    source = root / "source"
    shutil.copytree(REPO_ROOT, source, ignore=IGNORED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # --no-isolation builds with the setuptools installed here (the dev extra), without a download.
    proc = _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(source)], root, env
    )
    (sdist,) = (root / "dist").glob("*.tar.gz")
    (wheel,) = (root / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "log": proc.stdout + proc.stderr}


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> dict:
    """A fresh virtual environment holding the wheel; its interpreter, script folder and a clean environment."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    fresh_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The dependencies (torch, ...) of this environment, after the fresh site-packages on sys.path.
    (fresh_site / "dev_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(dists["wheel"]),
        ],
        env_dir,
        env,
    )
    return {"python": python, "bin": bin_dir, "site": fresh_site, "env": env}


def test_the_sdist_holds_the_configs_tests_constraints_and_license(dists) -> None:
    with tarfile.open(dists["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    expected = {"LICENSE", "CITATION.cff", "constraints.txt", "pyproject.toml", "setup.py", "MANIFEST.in"}
    assert expected <= names
    shipped = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert {"tests/conftest.py", "tests/test_packaging.py", "tools/train.py"} <= names


def test_the_wheel_holds_the_configs_as_package_data(dists) -> None:
    import zipfile

    with zipfile.ZipFile(dists["wheel"]) as archive:
        names = set(archive.namelist())
    shipped = {f"detr_peg/{p.relative_to(REPO_ROOT).as_posix()}" for p in (REPO_ROOT / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert "detr_peg/py.typed" in names  # type checkers read the package's hints (PEP 561)
    assert not any(name.startswith(("configs/", "tests/")) for name in names)
    # Every config folder is a declared package: no setuptools warning that a future release drops its files.
    assert "is absent from the `packages` configuration" not in dists["log"]


@pytest.mark.slow
def test_the_installed_wheel_runs_from_another_folder(installed, tmp_path) -> None:
    env, bin_dir = installed["env"], installed["bin"]
    where = _run([str(installed["python"]), "-c", "import detr_peg; print(detr_peg.__file__)"], tmp_path, env)
    assert Path(where.stdout.strip()).is_relative_to(installed["site"]), where.stdout
    assert not Path(where.stdout.strip()).is_relative_to(REPO_ROOT)

    detr_peg = str(bin_dir / "detr-peg")
    version = _run([detr_peg, "--version"], tmp_path, env)
    assert version.stdout.strip() == "detr-peg 0.1.0"

    demo = _run([detr_peg, "demo", "--data-only", "--output", "D"], tmp_path, env)
    assert "demo: dataset" in demo.stdout and (tmp_path / "D" / "data" / "annotations_val.json").is_file()

    printed = _run([detr_peg, "train", "--config", "detr_r50_peg", "--print-config"], tmp_path, env)
    assert "arch: detr" in printed.stdout and "name: peg" in printed.stdout

    listing = _run([detr_peg, "configs", "list"], tmp_path, env)
    assert str(installed["site"] / "detr_peg" / "configs") in listing.stdout
    assert "study/proxy_synthetic" in listing.stdout


def test_type_checkers_see_every_lazy_name() -> None:
    """The names imported on first use are imported under TYPE_CHECKING too, so that editors and type checkers see
    their types rather than Any (``__getattr__``)."""
    import ast

    import detr_peg

    tree = ast.parse((REPO_ROOT / "detr_peg" / "__init__.py").read_text())
    (block,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    seen = {f"{node.module}:{alias.name}" for node in block.body for alias in node.names}
    assert seen == {f"{module}:{name}" for name, module in detr_peg._EXPORTS.items()}
