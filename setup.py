"""Package discovery that pyproject.toml cannot express on its own.

The configs live in the repository's top-level ``configs/`` folder, their one
copy; the wheel carries them as ``detr_peg/configs`` (pyproject.toml maps the
folder with ``package-dir`` and lists the files with ``package-data``). A
mapped package is not found by ``packages.find``, so it and its subfolders are added here (each subfolder is a
package of its own for setuptools, which otherwise warns that it is absent). All other metadata is in
pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup

configs = ["detr_peg.configs", *(f"detr_peg.configs.{name}" for name in find_namespace_packages(where="configs"))]
setup(packages=[*find_packages(include=["detr_peg", "detr_peg.*"]), *configs])
