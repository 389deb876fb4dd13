"""Shared test fixtures.

Tests that need the reference fixtures or the coco128 images look for them in
``../shared`` next to the repository (or in ``$DETR_PEG_SHARED``) and skip with
a reason when they are absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import detr_peg.models  # noqa: F401  (registers the architectures and encodings configs are checked against)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("DETR_PEG_SHARED", REPO_ROOT.parent / "shared"))
REFERENCE_DIR = SHARED_DIR / "reference"
COCO128_DIR = SHARED_DIR / "data" / "coco128"

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The official-code fixtures (``shared/reference``); skips when absent."""
    if not (REFERENCE_DIR / "README.md").is_file():
        pytest.skip(f"reference fixtures not found at {REFERENCE_DIR} (set DETR_PEG_SHARED)")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def coco128_dir() -> Path:
    """128 real COCO images with annotations (``shared/data/coco128``); skips when absent."""
    if not (COCO128_DIR / "annotations.json").is_file():
        pytest.skip(f"coco128 not found at {COCO128_DIR} (set DETR_PEG_SHARED)")
    return COCO128_DIR
