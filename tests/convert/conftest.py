"""Transformers folders of the small random models, written once per session and shared by the tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def transformers_folder(tmp_path_factory) -> Callable[[str], Path]:
    """``folder(case)``: the saved Transformers folder of ``CASES[case]`` (see ``test_transformers_parity``).

    Tests must not change the folders; a test that edits one copies it first.
    """
    # Imported here: without Transformers installed, only the tests that use a folder are skipped.
    from tests.convert.transformers_models import CASES, save

    folders: dict[str, Path] = {}

    def folder(case: str) -> Path:
        if case not in folders:
            make, _ = CASES[case]
            folders[case] = save(make(), tmp_path_factory.mktemp(case))
        return folders[case]

    return folder
