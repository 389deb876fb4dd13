"""Fixtures of the engine tests: a synthetic dataset and reference runs."""

from __future__ import annotations

import pytest
import torch

from tests.engine.tiny_run import synthetic_data


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """8 training and 4 validation images of coloured shapes, 64 px, 4 classes."""
    return synthetic_data(tmp_path_factory.mktemp("shapes"))


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Train single-threaded: the models here are too small to gain from threads, and on a busy
    machine oversubscribed OpenMP threads make every step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
