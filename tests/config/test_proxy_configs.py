"""The proxy recipes of ``configs/proxy`` train with every positional encoding.

One training step of each proxy model, as configured, on a batch of two
96 x 96 images: the loss is finite, every parameter the encoding adds gets a
gradient, and the step changes the weights.
"""

from __future__ import annotations

import pytest
import torch

from detr_peg.config import load_config
from detr_peg.config.loader import config_to_dict
from detr_peg.engine.optimizer import build_optimizer
from detr_peg.models.builder import build_criterion, build_model
from tests.conftest import REPO_ROOT

PROXIES = ("detr_small", "deformable_small")
ENCODINGS = ("sine", "learned", "none", "peg")


def _targets() -> list[dict]:
    return [
        {"labels": torch.tensor([0, 3]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4]])},
        {"labels": torch.tensor([2]), "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.25]])},
    ]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("proxy", PROXIES)
def test_proxy_trains_one_step_with_every_encoding(proxy: str, encoding: str) -> None:
    cfg = load_config(
        REPO_ROOT / "configs" / "proxy" / f"{proxy}.yaml", [f"model.position.name={encoding}", "model.num_classes=4"]
    )
    assert cfg.data.train_scales == [96] and cfg.data.val_scale == 96
    torch.manual_seed(0)
    model = build_model(cfg).train()
    criterion = build_criterion(cfg)
    optimizer = build_optimizer(model, cfg.train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    out = model(torch.randn(2, 3, 96, 96), torch.zeros(2, 96, 96, dtype=torch.bool))
    assert out["pred_boxes"].shape == (2, cfg.model.num_queries, 4)
    loss = criterion.weighted_total(criterion(out, _targets()))
    assert torch.isfinite(loss)
    loss.backward()
    position_params = {n: p for n, p in model.named_parameters() if ".position." in f".{n}"}
    assert bool(position_params) == (encoding in ("learned", "peg"))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in position_params.values())
    optimizer.step()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


@pytest.mark.parametrize(("proxy", "budget"), [("detr_small", 4000), ("deformable_small", 2750)])
def test_a_multiscale_proxy_is_its_single_size_recipe_with_one_size_per_batch_and_its_budget(
    proxy: str, budget: int
) -> None:
    """``configs/proxy/*_multiscale.yaml`` changes only the training sizes (one per batch) and the budget."""
    base = _flat(config_to_dict(load_config(REPO_ROOT / "configs" / "proxy" / f"{proxy}.yaml")))
    multi = _flat(config_to_dict(load_config(REPO_ROOT / "configs" / "proxy" / f"{proxy}_multiscale.yaml")))
    assert base.keys() == multi.keys()
    changed = {key: (base[key], multi[key]) for key in base if base[key] != multi[key]}
    assert changed == {
        "data.train_scales": ([96], [64, 72, 80, 88, 96, 104, 112, 120, 128]),
        "data.train_max_size": (96, 128),
        "data.train_size_per": ("image", "batch"),
        "train.max_iters": (base["train.max_iters"], budget),
        "train.output_dir": (f"outputs/proxy/{proxy}", f"outputs/proxy/{proxy}_multiscale"),
    }
    # The budget ends the run before the epoch bound and before any learning-rate drop.
    assert budget <= multi["train.epochs"] * 2000 // multi["train.batch_size"]
    assert budget <= multi["train.lr_drop"] * 2000 // multi["train.batch_size"]
