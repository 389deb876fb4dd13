"""Reading official DETR (facebookresearch/detr) checkpoints."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from detr_peg.convert.key_map import KeyMap
from detr_peg.convert.registry import OFFICIAL_FORMATS, OfficialFormat
from detr_peg.errors import CheckpointError

# ResNet depth by (blocks per stage, bottleneck?) as stored under backbone.0.body.
RESNET_DEPTHS = {
    ((2, 2, 2, 2), False): "resnet18",
    ((3, 4, 6, 3), False): "resnet34",
    ((3, 4, 6, 3), True): "resnet50",
    ((3, 4, 23, 3), True): "resnet101",
    ((3, 8, 36, 3), True): "resnet152",
}

BACKBONE_PREFIX = "backbone.0.body."

DETR_KEY_MAP = KeyMap(
    [
        (r"backbone\.0\.body\.(.*)", r"backbone.body.\1"),
        (r"backbone\.1\.(row_embed|col_embed)\.weight", r"transformer.position.\1.weight"),
        (r"transformer\.decoder\.layers\.(\d+)\.multihead_attn\.(.*)", r"transformer.decoder.layers.\1.cross_attn.\2"),
    ]
)

# Official argparse names shared by DETR and Deformable-DETR -> detr_peg config keys.
COMMON_ARGS: dict[str, Any] = {
    "lr": "train.lr",
    "lr_backbone": lambda v: {"train.lr_backbone": float(v), "model.backbone.train": float(v) > 0},
    "batch_size": "train.batch_size",
    "weight_decay": "train.weight_decay",
    "epochs": "train.epochs",
    "lr_drop": "train.lr_drop",
    "clip_max_norm": "train.clip_max_norm",
    "seed": "train.seed",
    "backbone": "model.backbone.name",
    "dilation": "model.backbone.dilation",
    "position_embedding": lambda v: {"model.position.name": {"v2": "sine", "v3": "learned"}.get(v, v)},
    "enc_layers": "model.transformer.enc_layers",
    "dec_layers": "model.transformer.dec_layers",
    "dim_feedforward": "model.transformer.dim_feedforward",
    "hidden_dim": "model.transformer.hidden_dim",
    "dropout": "model.transformer.dropout",
    "nheads": "model.transformer.nheads",
    "num_queries": "model.num_queries",
    "aux_loss": "model.aux_loss",
    "set_cost_class": "loss.set_cost_class",
    "set_cost_bbox": "loss.set_cost_bbox",
    "set_cost_giou": "loss.set_cost_giou",
    "bbox_loss_coef": "loss.bbox_loss_coef",
    "giou_loss_coef": "loss.giou_loss_coef",
}

DETR_ARGS = {**COMMON_ARGS, "pre_norm": "model.transformer.pre_norm", "eos_coef": "loss.eos_coef"}


def count_indexed(state: dict[str, Tensor], prefix: str) -> int:
    """How many ``prefix{i}.`` modules a state dict holds (``i`` = 0, 1, ...)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def infer_resnet(state: dict[str, Tensor], prefix: str = BACKBONE_PREFIX) -> str:
    """The torchvision ResNet name whose layout the backbone weights have."""
    blocks = tuple(count_indexed(state, f"{prefix}layer{s}.") for s in range(1, 5))
    bottleneck = f"{prefix}layer1.0.conv3.weight" in state
    name = RESNET_DEPTHS.get((blocks, bottleneck))
    if name is None:
        raise CheckpointError(
            f"Backbone with {blocks} blocks per stage (bottleneck={bottleneck}) is not a known ResNet; "
            "set model.backbone.name explicitly."
        )
    return name


def _is_detr(state: dict[str, Tensor]) -> bool:
    return (
        "query_embed.weight" in state
        and "input_proj.weight" in state
        and any(k.startswith("transformer.encoder.layers.0.self_attn.in_proj") for k in state)
    )


def _infer_detr(state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    queries, hidden = state["query_embed.weight"].shape
    hard = {
        "model.arch": "detr",
        "model.backbone.name": infer_resnet(state),
        "model.num_queries": queries,
        "model.num_classes": state["class_embed.weight"].shape[0] - 1,
        "model.transformer.hidden_dim": hidden,
        "model.transformer.enc_layers": count_indexed(state, "transformer.encoder.layers."),
        "model.transformer.dec_layers": count_indexed(state, "transformer.decoder.layers."),
        "model.transformer.dim_feedforward": state["transformer.encoder.layers.0.linear1.weight"].shape[0],
        "model.transformer.pre_norm": "transformer.encoder.norm.weight" in state,
    }
    soft: dict[str, Any] = {"model.position.name": "sine", "data.contiguous_labels": False}
    if "backbone.1.row_embed.weight" in state:
        soft["model.position.name"] = "learned"
        hard["model.position.num_embeddings"] = state["backbone.1.row_embed.weight"].shape[0]
    return hard, soft


OFFICIAL_FORMATS.register("detr")(
    OfficialFormat(
        name="DETR", arch="detr", matches=_is_detr, infer=_infer_detr, key_map=DETR_KEY_MAP, args_map=DETR_ARGS
    )
)
