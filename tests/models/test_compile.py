"""``train.compile``: both detectors trace under ``torch.compile`` in CPU training with dropout.

The CPU dropout of :mod:`detr_peg.models.dropout` draws its mask with a size
computed from the input's shape, which ``torch.compile`` cannot trace once the
shapes are symbolic (a second image size or batch compiles a dynamic graph); under
compilation the models use torch's own dropout. The ``eager`` backend runs
Dynamo's tracing, where that failure happened, without generating code, so
that the test stays fast. The graph breaks are counted too: DETR traces whole,
and Deformable-DETR breaks only at its CPU attention function, which
``torch.compile`` calls as it is (its backward builds sparse tensors).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from detr_peg.config import load_config
from detr_peg.models import build_criterion, build_model
from tests.engine.tiny_run import TINY_MODEL
from tests.models.deformable.small_model import SMALL as SMALL_DEFORMABLE

#: Each test traces a model with Dynamo: tens of seconds for Deformable-DETR.
pytestmark = pytest.mark.slow

#: Deformable-DETR with one encoder layer: the trace is per layer. Two decoder layers, so the auxiliary outputs
#: and the second layer's references from the first are traced too.
SMALL = {
    "detr": ["model.arch=detr", *TINY_MODEL, "model.num_classes=4"],
    "deformable_detr": [*SMALL_DEFORMABLE, "model.transformer.enc_layers=1"],
}

#: The second step's batch and size, which Dynamo compiles with symbolic sizes: DETR at another batch and image
#: size, Deformable-DETR at another batch only. Symbolic image sizes would cost Deformable-DETR 24 s more here
#: (its levels' shapes); the dropout that a symbolic trace broke is one module, shared by both detectors.
SECOND = {"detr": (2, 128, 96), "deformable_detr": (2, 96, 128)}


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_training_with_dropout_compiles_for_other_sizes_and_batches(arch: str) -> None:
    cfg = load_config(None, [*SMALL[arch], "model.transformer.dropout=0.1"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    criterion = build_criterion(cfg)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager")
    target = {"labels": torch.tensor([1, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]])}
    for batch, height, width in ((1, 96, 128), SECOND[arch]):
        images = torch.randn(batch, 3, height, width)
        mask = torch.zeros(batch, height, width, dtype=torch.bool)
        targets = [target] * batch
        model.zero_grad(set_to_none=True)
        loss = criterion.weighted_total(criterion(compiled(images, mask), targets))
        loss.backward()
        assert torch.isfinite(loss)
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
    breaks = list(counters["graph_break"])
    if arch == "detr":
        assert breaks == []
    else:
        assert breaks and all("_embedding_bag_msda" in reason for reason in breaks), breaks


def test_compiled_evaluation_is_the_eager_model() -> None:
    """In evaluation (no dropout) the compiled model gives the eager model's outputs.

    DETR only: dropout is the one module that differs under compilation, and it is shared by both detectors
    (a second Deformable-DETR trace in evaluation mode costs about 20 s here, for the same module).
    """
    cfg = load_config(None, [*SMALL["detr"], "model.transformer.dropout=0.1"])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    compiled = torch.compile(model, backend="eager")
    images = torch.randn(1, 3, 96, 112)
    mask = torch.zeros(1, 96, 112, dtype=torch.bool)
    with torch.no_grad():
        expected = model(images, mask)
        got = compiled(images, mask)
    torch.testing.assert_close(got["pred_logits"], expected["pred_logits"])
    torch.testing.assert_close(got["pred_boxes"], expected["pred_boxes"])
