"""Fixtures of the engine tests: a synthetic dataset and reference runs."""

from __future__ import annotations

import pytest

from tests.engine.tiny_run import synthetic_data


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """8 training and 4 validation images of coloured shapes, 64 px, 4 classes."""
    return synthetic_data(tmp_path_factory.mktemp("shapes"))
