"""From a pretrained DETR to PEG: ``train.init_from`` a converted sine checkpoint with ``model.position.name=peg``.

The converted Transformers DETR (sine) starts a PEG run of the same
architecture on data with the same categories (the synthetic shapes, ids
1..4, as the model's ``id2label`` names them): every weight loads, the class
head included, except the positional encoding's, and the PEG (which the
sine model does not have) starts fresh. The run trains two iterations.
"""

from __future__ import annotations

import logging
import warnings

import torch

from detr_peg import load_model
from detr_peg.cli.main import main
from detr_peg.config import load_config
from detr_peg.data.coco_dataset import build_coco_dataset
from detr_peg.engine.checkpointing import POSITION_PREFIX, load_initial_weights
from detr_peg.models import build_model
from tests.engine.tiny_run import RUN, SMALL_IMAGES, data_overrides, synthetic_data

#: The architecture of the converted model (``transformers_models.detr_model``).
CONVERTED_DETR = [
    "model.arch=detr",
    "model.backbone.name=resnet18",
    "model.backbone.weights=null",
    "model.backbone.out_stages=[4]",
    "model.transformer.hidden_dim=32",
    "model.transformer.nheads=2",
    "model.transformer.enc_layers=2",
    "model.transformer.dec_layers=2",
    "model.transformer.dim_feedforward=64",
    "model.num_queries=8",
    "data.contiguous_labels=false",  # the converted label map: label = category id, as id2label says
]


def test_a_peg_run_starts_from_a_converted_sine_detr(transformers_folder, tmp_path, caplog):
    converted = tmp_path / "detr_sine.pth"
    assert main(["convert", str(transformers_folder("detr")), str(converted)]) == 0
    sine = load_model(converted).model.state_dict()

    data = synthetic_data(tmp_path / "data", num_train=4, num_val=2)
    overrides = [
        *CONVERTED_DETR,
        "model.position.name=peg",
        f"train.init_from={converted}",
        *SMALL_IMAGES,
        *RUN,
        *data_overrides(data.train_images, data.train_annotations, data.val_images, data.val_annotations),
        "train.batch_size=2",
        "train.max_iters=2",
    ]
    cfg = load_config(None, [*overrides, "model.num_classes=5"])
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="detr_peg"), warnings.catch_warnings():
        warnings.simplefilter("error")  # the same categories: no warning about the class head
        load_initial_weights(
            model, str(converted), num_classes=5, label_map=data_label_map(data), reset_classifier=False, position="peg"
        )
    loaded = model.state_dict()
    pegs = sorted(k for k in loaded if k.startswith(POSITION_PREFIX))
    assert pegs and all(k.startswith("transformer.position.pegs.") for k in pegs)
    assert not any(k.startswith(POSITION_PREFIX) for k in sine)  # the sine encoding has no weights
    for key, value in loaded.items():
        expected = fresh[key] if key in pegs else sine[key]
        assert torch.equal(value, expected), key
    assert f"{len(sine)} weights loaded, {len(pegs)} of the encoding start fresh" in caplog.text

    out = tmp_path / "run"
    assert main(["train", "--output", str(out), *overrides]) == 0
    trained = load_model(out / "checkpoint.pth")
    assert trained.config.model.position.name == "peg" and trained.iteration == 2


def data_label_map(data):
    cfg = load_config(None, [*CONVERTED_DETR, *data_overrides(data.train_images, data.train_annotations)])
    return build_coco_dataset(cfg.data, "train").label_map
