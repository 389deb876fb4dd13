"""Package discovery that pyproject.toml cannot express on its own.

The configs live in the repository's top-level ``configs/`` folder, their one
copy; the wheel carries them as ``detr_peg/configs`` (pyproject.toml maps the
folder with ``package-dir`` and lists the files with ``package-data``). A
mapped package is not found by ``packages.find``, so it is added here. All
other metadata is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["detr_peg", "detr_peg.*"]), "detr_peg.configs"])
