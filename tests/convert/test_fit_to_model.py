"""What a conversion may leave to initialisation (only a positional encoding the source has not), and the official
copies of a head that the model holds once (identical, or refused by the Deformable-DETR format)."""

from __future__ import annotations

import pytest
import torch

from detr_peg.config import load_config
from detr_peg.convert.report import fit_to_model
from detr_peg.errors import CheckpointError
from detr_peg.models import build_model
from tests.engine.tiny_run import TINY_MODEL


def _source(*overrides: str) -> tuple:
    cfg = load_config(None, [*TINY_MODEL, "model.num_classes=2", "model.arch=deformable_detr", *overrides])
    torch.manual_seed(0)
    return cfg, {k: v.clone() for k, v in build_model(cfg).state_dict().items()}


def test_only_a_positional_encoding_may_be_new() -> None:
    cfg, state = _source("model.position.name=peg")
    pegs = sorted(k for k in state if k.startswith("transformer.position.") and not k.endswith("num_batches_tracked"))
    sine = {k: v for k, v in state.items() if not k.startswith("transformer.position.")}
    _, new_keys, unused = fit_to_model(cfg, sine, "official.pth")  # sine weights converted to PEG
    assert new_keys == pegs and pegs and unused == []
    del sine["transformer.encoder.layers.0.linear1.bias"]
    with pytest.raises(CheckpointError, match=r"^official.pth lacks 1 trained weight\(s\) of the model, such as "
                       r"'transformer.encoder.layers.0.linear1.bias'; a conversion initialises only"):  # fmt: skip
        fit_to_model(cfg, sine, "official.pth")


def test_official_copies_of_a_shared_head_must_be_identical() -> None:
    """The official single-stage Deformable-DETR stores its one class head once per decoder layer."""
    from detr_peg.convert.deformable import _complete_deformable

    cfg, state = _source()
    copies = {**state, "class_embed.1.weight": state["class_embed.0.weight"].clone()}
    _complete_deformable(copies, cfg)  # identical copies: stored once
    merged, _, unused = fit_to_model(cfg, copies, "official.pth")
    assert unused == ["class_embed.1.weight"]
    torch.testing.assert_close(merged["class_embed.0.weight"], state["class_embed.0.weight"])
    copies["class_embed.1.weight"] = state["class_embed.0.weight"] + 1
    with pytest.raises(CheckpointError, match=r"^'class_embed.1.weight' differs from 'class_embed.0.weight', but the "
                       r"official single-stage model shares that head"):  # fmt: skip
        _complete_deformable(copies, cfg)
