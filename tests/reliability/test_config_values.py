"""Config values the model cannot use are refused before anything is built, in one line.

The rule (one mechanism, :mod:`detr_peg.config.ranges`): every numeric field
states its valid range in the schema (resource-sized values with an upper
bound), floats must be finite, and an option of another
architecture or encoding than the chosen one is an error. Each case runs one
``detr-peg`` command in its own process on a copy of an earlier run (see
``conftest.py``) and checks exit status 2, exactly one stderr line naming
the key, the value and the range, no traceback, and every earlier output
byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.reliability.conftest import OUT, RESUME, assert_one_line_error, assert_outputs_kept, snapshot

EVAL = ["eval", "--checkpoint", OUT / "checkpoint.pth", "--output", OUT]


def _file(text: str) -> Callable[[Path], None]:
    def prepare(case: Path) -> None:
        (case / "my.yaml").write_text(text)

    return prepare


CASES: list[tuple[str, Sequence, Sequence[str], Callable[[Path], None] | None]] = [
    # the examples of the rule
    ("num-queries-zero", [*RESUME, "model.num_queries=0"], ["'model.num_queries' must be in [1, 100000], got 0"], None),
    (
        "hidden-dim-zero",
        [*RESUME, "model.transformer.hidden_dim=0"],
        ["'model.transformer.hidden_dim' must be in [1, 16384], got 0"],
        None,
    ),
    (
        "dropout-above-one",
        [*RESUME, "model.transformer.dropout=1.5"],
        ["'model.transformer.dropout' must be in [0, 1), got 1.5"],
        None,
    ),
    ("lr-nan", [*RESUME, "train.lr=.nan"], ["'train.lr' must be a finite number at least 0, got nan"], None),
    (
        "total-batch-zero",
        [*RESUME, "train.total_batch_size=0"],
        ["'train.total_batch_size' must be at least 1, got 0"],
        None,
    ),
    ("workers-negative", [*RESUME, "data.num_workers=-3"], ["'data.num_workers' must be in [0, 1024], got -3"], None),
    (
        "glu-activation",
        [*RESUME, "model.transformer.activation=glu"],
        ["'model.transformer.activation' must be one of 'relu', 'gelu'", "'glu'"],
        None,
    ),
    # more members of the class
    (
        "heads-zero",
        [*RESUME, "model.transformer.nheads=0"],
        ["'model.transformer.nheads' must be in [1, 1024], got 0"],
        None,
    ),
    (
        "no-decoder-layers",
        [*RESUME, "model.transformer.dec_layers=0"],
        ["'model.transformer.dec_layers' must be in [1, 1000], got 0"],
        None,
    ),
    (
        "negative-weight-decay",
        [*RESUME, "train.weight_decay=-1e-4"],
        ["'train.weight_decay' must be at least 0, got -0.0001"],
        None,
    ),
    (
        "backbone-lr-inf",
        [*RESUME, "train.lr_backbone=.inf"],
        ["'train.lr_backbone' must be a finite number", "inf"],
        None,
    ),
    (
        "clip-minus-inf",
        [*RESUME, "train.clip_max_norm=-.inf"],
        ["'train.clip_max_norm' must be a finite", "-inf"],
        None,
    ),
    ("zero-epochs", [*RESUME, "train.epochs=0"], ["'train.epochs' must be at least 1, got 0"], None),
    ("zero-max-iters", [*RESUME, "train.max_iters=0"], ["'train.max_iters' must be at least 1, got 0"], None),
    ("lr-gamma-above-one", [*RESUME, "train.lr_gamma=2"], ["'train.lr_gamma' must be in [0, 1], got 2.0"], None),
    ("log-every-zero", [*RESUME, "train.log_every=0"], ["'train.log_every' must be at least 1, got 0"], None),
    ("negative-seed", [*RESUME, "train.seed=-1"], ["'train.seed' must be in [0, 2147483647], got -1"], None),
    ("flip-probability", [*RESUME, "data.hflip_prob=1.5"], ["'data.hflip_prob' must be in [0, 1], got 1.5"], None),
    (
        "negative-train-scale",
        [*RESUME, "data.train_scales=[64,-1]"],
        ["'data.train_scales' must be in [2, 8192], got [64, -1]"],
        None,
    ),
    (
        "zero-crop-size",
        [*RESUME, "data.crop_size=[0,64]"],
        ["'data.crop_size' must be in [1, 8192], got [0, 64]"],
        None,
    ),
    (
        "negative-loss-weight",
        [*RESUME, "loss.giou_loss_coef=-2"],
        ["'loss.giou_loss_coef' must be at least 0, got -2.0"],
        None,
    ),
    ("zero-classes", [*RESUME, "model.num_classes=0"], ["'model.num_classes' must be in [1, 100000], got 0"], None),
    (
        "too-many-workers",
        [*RESUME, "data.num_workers=100000"],
        ["'data.num_workers' must be in [0, 1024], got 100000"],
        None,
    ),
    (
        "eval-threshold-negative",
        [*EVAL, "eval.score_threshold=-0.1"],
        ["'eval.score_threshold' must be in [0, 1], got -0.1"],
        None,
    ),
    ("eval-batch-zero", [*EVAL, "eval.batch_size=0"], ["'eval.batch_size' must be in [1, 100000], got 0"], None),
    # a trained checkpoint fixes what its weights compute, however the change comes
    (
        "eval-other-activation",
        [*EVAL, "model.transformer.activation=gelu"],
        ["model.transformer.activation cannot be 'gelu' for", "its weights were trained with 'relu'"],
        None,
    ),
    (
        "eval-config-file-changes-the-model",
        [*EVAL, "--config", "my.yaml"],
        ["model.backbone.dilation cannot be True for", "its weights were trained with False"],
        _file("model:\n  backbone:\n    dilation: true\n"),
    ),
    (
        "predict-other-encoding",
        [
            "predict",
            "--checkpoint",
            OUT / "checkpoint.pth",
            "data/images",
            "--output",
            OUT / "predictions",
            "model.position.name=none",
        ],
        ["model.position.name cannot be 'none' for", "its weights were trained with 'sine'"],
        None,
    ),  # fmt: skip
    (
        "export-other-activation",
        ["export", "--checkpoint", OUT / "checkpoint.pth", "--output", "m.onnx", "model.transformer.activation=gelu"],
        ["model.transformer.activation cannot be 'gelu' for"],
        None,
    ),
    (
        "nan-in-a-config-file",
        [*RESUME, "--config", "my.yaml"],
        ["my.yaml", "'loss.bbox_loss_coef' must be a finite", "nan"],
        _file("loss:\n  bbox_loss_coef: .nan\n"),
    ),
    (
        "inf-in-a-config-file",
        [*RESUME, "--config", "my.yaml"],
        ["my.yaml", "'data.crop_prob' must be a finite", "inf"],
        _file("data:\n  crop_prob: .inf\n"),
    ),
    # options of another architecture or encoding, which used to be ignored
    (
        "deformable-option-with-detr",
        [*RESUME, "model.transformer.num_feature_levels=2"],
        [
            "'model.transformer.num_feature_levels' is an option of model.arch 'deformable_detr', not of model.arch 'detr'"
        ],
        None,
    ),
    (
        "box-refine-with-detr",
        [*RESUME, "model.with_box_refine=true"],
        ["'model.with_box_refine' is an option of model.arch 'deformable_detr'"],
        None,
    ),
    (
        "peg-option-with-sine",
        [*RESUME, "model.position.peg_kernel=5"],
        ["'model.position.peg_kernel' is an option of model.position.name 'peg', not of model.position.name 'sine'"],
        None,
    ),
    (
        "peg-kernel-zero",
        [*RESUME, "model.position.name=peg", "model.position.peg_kernel=0"],
        ["'model.position.peg_kernel' must be in [1, 255], got 0"],
        None,
    ),
    # resource-sized values beyond their upper bounds
    (
        "a-billion-queries",
        [*RESUME, "model.num_queries=1000000000"],
        ["'model.num_queries' must be in [1, 100000], got 1000000000"],
        None,
    ),
    (
        "huge-width",
        [*RESUME, "model.transformer.hidden_dim=10000000"],
        ["'model.transformer.hidden_dim' must be in [1, 16384]"],
        None,
    ),
    (
        "huge-feedforward",
        [*RESUME, "model.transformer.dim_feedforward=100000000000"],
        ["'model.transformer.dim_feedforward' must be in [1, 1000000]"],
        None,
    ),
    (
        "a-billion-layers",
        [*RESUME, "model.transformer.enc_layers=1000000000"],
        ["'model.transformer.enc_layers' must be in [0, 1000]"],
        None,
    ),
    (
        "huge-images",
        [*RESUME, "data.train_scales=[10000000]", "data.train_max_size=10000000"],
        ["'data.train_scales' must be in [2, 8192], got [10000000]"],
        None,
    ),
    ("huge-batch", [*RESUME, "train.batch_size=1000000000"], ["'train.batch_size' must be in [1, 100000]"], None),
    (
        "huge-learned-tables",
        [*RESUME, "model.position.name=learned", "model.position.num_embeddings=100000000000"],
        ["'model.position.num_embeddings' must be in [1, 100000]"],
        None,
    ),
    (
        "huge-peg-kernel",
        [*RESUME, "model.position.name=peg", "model.position.peg_kernel=100001"],
        ["'model.position.peg_kernel' must be in [1, 255]"],
        None,
    ),
    ("too-many-classes", [*RESUME, "model.num_classes=100001"], ["'model.num_classes' must be in [1, 100000]"], None),
]


@pytest.mark.parametrize("args, fragments, prepare", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_unusable_config_value_is_one_clear_line(cli, case: Path, args, fragments, prepare) -> None:
    if prepare is not None:
        prepare(case)
    before = snapshot(case / OUT)
    result = cli.run(args, cwd=case)
    assert_one_line_error(result, *fragments)
    assert_outputs_kept(before, case / OUT)
