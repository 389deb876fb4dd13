"""Adding a positional encoding is one new file: discovery imports it, the registry tests cover it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import detr_peg.models.position as position_package
from detr_peg.config.options import ENCODING_OPTIONS
from detr_peg.models.position import INFRASTRUCTURE, POSITION_ENCODINGS, discover_encodings
from tests.conftest import REPO_ROOT

TOY_MODULE = '''
"""A toy additive encoding: a learned vector per channel, scaled by the row index."""

from dataclasses import dataclass, field

import torch
from torch import nn

from detr_peg.config.ranges import valid
from detr_peg.config.schema import PositionConfig
from detr_peg.models.position.base import PositionalEncoding
from detr_peg.models.position.registry import register_encoding


@dataclass
class ToyOptions(PositionConfig):
    gain: float = field(default=0.1, metadata=valid(0))


class ToyEncoding(PositionalEncoding):
    def __init__(self, dim, gain):
        super().__init__(dim)
        self.weight = nn.Parameter(torch.randn(dim) * gain)

    def forward(self, mask):
        b, h, w = mask.shape
        rows = torch.arange(h, dtype=torch.float32, device=mask.device).view(1, 1, h, 1)
        return (self.weight.view(1, -1, 1, 1) * rows).expand(b, -1, h, w)


@register_encoding("toy", options=ToyOptions)
def build_toy(cfg, *, dim, num_levels, num_layers):
    return ToyEncoding(dim, cfg.gain)
'''

# In a fresh interpreter: put the folder on the package path, discover, check the config, run the registry tests.
SCRIPT = """
import sys
import detr_peg.models.position as position
position.__path__.append(sys.argv[1])
assert "toy" in position.discover_encodings()
from detr_peg.config import load_config
cfg = load_config(None, ["model.position.name=toy", "model.position.gain=0.5"])
assert type(cfg.model.position).__name__ == "ToyOptions" and cfg.model.position.gain == 0.5
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/models/position/test_registry.py", "-k", "toy"]))
"""


def test_every_module_of_the_package_registers_an_encoding():
    """A module that forgets its registration fails here instead of silently offering nothing."""
    files = {p.stem for p in Path(position_package.__file__).parent.glob("*.py")} - {"__init__"} - INFRASTRUCTURE
    assert set(discover_encodings()) == files
    registered_in = {POSITION_ENCODINGS.get(name).__module__.rpartition(".")[2] for name in POSITION_ENCODINGS.names()}
    assert files <= registered_in, f"modules that register no encoding: {sorted(files - registered_in)}"
    assert ENCODING_OPTIONS.names() == POSITION_ENCODINGS.names()


def test_a_toy_encoding_in_one_new_file_is_selectable_and_tested(tmp_path):
    (tmp_path / "toy.py").write_text(textwrap.dedent(TOY_MODULE))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    counts = dict((kind, int(n)) for n, kind in re.findall(r"(\d+) (passed|failed|error)", result.stdout))
    # The parametrized registry tests: padding invariance, mixing in training, learning in a DETR.
    assert counts == {"passed": 3}, result.stdout
