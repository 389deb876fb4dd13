"""Train or evaluate DETR-PEG and Deformable-DETR-PEG with detectron2.

For detectron2 users: detectron2's ``DefaultTrainer`` (data loading, hooks,
checkpoints, TensorBoard, ``launch`` for several GPUs or machines) around
the detr_peg detectors, with DETR's augmentation
(:class:`~detr_peg.integrations.detectron2.DetrPegDatasetMapper`), AdamW
parameter groups (``SOLVER.BACKBONE_MULTIPLIER``) and full-model gradient
clipping (:func:`~detr_peg.integrations.detectron2.build_detr_peg_optimizer`),
and COCO evaluation (``COCOEvaluator``). detectron2 must be installed (see its
install guide); the detr_peg command line (``detr-peg train``) needs no
detectron2.

Usage, from the repository root::

    python tools/train_detectron2.py --config-file configs/detectron2/detr_r50_peg_coco.yaml --num-gpus 8
    python tools/train_detectron2.py --config-file configs/detectron2/detr_r50_peg_coco.yaml \\
        --eval-only MODEL.WEIGHTS outputs/d2_detr_r50_peg/model_final.pth
    # your own COCO-format data, registered under a name:
    python tools/train_detectron2.py --config-file configs/detectron2/detr_r50_peg_coco.yaml \\
        --register mydata_train train.json images/ --register mydata_val val.json images/ \\
        DATASETS.TRAIN "('mydata_train',)" DATASETS.TEST "('mydata_val',)" MODEL.DETR_PEG.NUM_CLASSES 3
    # detr_peg settings of the detector:
    ... MODEL.DETR_PEG.OVERRIDES "['model.position.name=sine', 'model.backbone.weights=r50.pth']"

The built-in ``coco_2017_*`` datasets are read from ``$DETECTRON2_DATASETS``
(default ``./datasets``), as detectron2 lays them out.
"""

from __future__ import annotations

import argparse
import os

from detr_peg.cli.extras import require

require("tools/train_detectron2.py", "detectron2")  # one line and exit status 2 without it, --help included

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode, get_cfg
from detectron2.data import build_detection_test_loader, build_detection_train_loader
from detectron2.data.datasets import register_coco_instances
from detectron2.engine import DefaultTrainer, default_argument_parser, default_setup, launch
from detectron2.evaluation import COCOEvaluator

from detr_peg.integrations.detectron2 import DetrPegDatasetMapper, add_detr_peg_config, build_detr_peg_optimizer


class Trainer(DefaultTrainer):
    """detectron2's default trainer with the DETR-PEG data mapper, optimizer and COCO evaluation."""

    @classmethod
    def build_train_loader(cls, cfg: CfgNode):
        return build_detection_train_loader(cfg, mapper=DetrPegDatasetMapper(cfg, is_train=True))

    @classmethod
    def build_test_loader(cls, cfg: CfgNode, dataset_name: str):
        return build_detection_test_loader(cfg, dataset_name, mapper=DetrPegDatasetMapper(cfg, is_train=False))

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str, output_folder: str | None = None):
        output_folder = output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name)
        return COCOEvaluator(dataset_name, output_dir=output_folder)

    @classmethod
    def build_optimizer(cls, cfg: CfgNode, model):
        return build_detr_peg_optimizer(cfg, model)


def setup(args: argparse.Namespace) -> CfgNode:
    """The frozen detectron2 config: defaults, detr_peg keys, the config file, then command-line pairs."""
    cfg = get_cfg()
    add_detr_peg_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.freeze()
    default_setup(cfg, args)
    return cfg


def register_datasets(registrations: list[list[str]] | None) -> None:
    """Register ``(name, annotation JSON, image folder)`` COCO-format datasets, once per process."""
    from detectron2.data import DatasetCatalog

    for name, json_file, image_root in registrations or []:
        if name not in DatasetCatalog.list():
            register_coco_instances(name, {}, json_file, image_root)


def main(args: argparse.Namespace):
    register_datasets(args.register)
    cfg = setup(args)
    if args.eval_only:
        model = Trainer.build_model(cfg)
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(cfg.MODEL.WEIGHTS, resume=args.resume)
        return Trainer.test(cfg, model)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def build_parser() -> argparse.ArgumentParser:
    parser = default_argument_parser(epilog=__doc__)
    parser.add_argument("--register", nargs=3, action="append", metavar=("NAME", "JSON", "IMAGES"),
                        help="register a COCO-format dataset under NAME (may be repeated)")  # fmt: skip
    return parser


if __name__ == "__main__":
    arguments = build_parser().parse_args()
    launch(
        main,
        arguments.num_gpus,
        num_machines=arguments.num_machines,
        machine_rank=arguments.machine_rank,
        dist_url=arguments.dist_url,
        args=(arguments,),
    )
