"""The learned table beyond its size: a config error naming the field and the size needed, never a crash."""

from __future__ import annotations

import pytest
import torch

from detr_peg.errors import ConfigError, UserError
from detr_peg.models.builder import build_model
from detr_peg.models.position.learned import LearnedPositionalEncoding
from tests.engine.tiny_run import TINY_MODEL, tiny_config


def test_sizes_up_to_the_table_are_encoded_and_larger_ones_refused() -> None:
    encoding = LearnedPositionalEncoding(8, num_embeddings=4)
    pos = encoding(torch.zeros(2, 4, 3, dtype=torch.bool))
    assert pos.shape == (2, 8, 4, 3)
    torch.testing.assert_close(pos[0, :4, 2, 1], encoding.col_embed.weight[1])
    torch.testing.assert_close(pos[1, 4:, 2, 1], encoding.row_embed.weight[2])
    with pytest.raises(ConfigError, match=r"Feature map 3x5 .*model.position.num_embeddings=4.* >= 5"):
        encoding(torch.zeros(1, 3, 5, dtype=torch.bool))


def test_detector_beyond_the_table_raises_a_user_error() -> None:
    """64 px images give a 4 x 4 map at stride 16 (fits a 4-row table); 96 px give 6 x 6 (does not)."""
    cfg = tiny_config(
        [*TINY_MODEL, "model.num_classes=3", "model.position.name=learned", "model.position.num_embeddings=4"]
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool))
        assert out["pred_logits"].shape == (1, 8, 4)
        with pytest.raises(UserError, match="num_embeddings >= 6"):
            model(torch.zeros(1, 3, 96, 96), torch.zeros(1, 96, 96, dtype=torch.bool))
