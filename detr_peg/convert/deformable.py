"""Reading official Deformable-DETR checkpoints: single-stage, ``--with_box_refine`` and ``--two_stage``.

Decoder copies of shared heads are aliases (checked identical, dropped). The number of heads is not
in the weights: it comes from the stored ``args``, a config or ``model.transformer.nheads=...``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from detr_peg.config.schema import Config
from detr_peg.convert.detr import COMMON_ARGS, count_indexed, infer_resnet
from detr_peg.convert.key_map import KeyMap
from detr_peg.convert.registry import OFFICIAL_FORMATS, OfficialFormat
from detr_peg.errors import CheckpointError

DEFORMABLE_KEY_MAP = KeyMap(
    [
        (r"backbone\.0\.body\.(.*)", r"backbone.body.\1"),
        (r"backbone\.1\.(row_embed|col_embed)\.weight", r"transformer.position.\1.weight"),
        (r"input_proj\.(\d+)\.0\.(weight|bias)", r"input_proj.\1.conv.\2"),
        (r"input_proj\.(\d+)\.1\.(weight|bias)", r"input_proj.\1.norm.\2"),
        (r"transformer\.decoder\.bbox_embed\.(.*)", r"bbox_embed.\1"),
        (r"transformer\.decoder\.class_embed\.(.*)", r"class_embed.\1"),
    ]
)


def _num_queries(value: Any) -> dict[str, Any]:
    # The official code uses --num_queries both for the learned queries and
    # for the two-stage proposals kept.
    return {"model.num_queries": value, "model.transformer.two_stage_num_proposals": value}


DEFORMABLE_ARGS: dict[str, Any] = {
    **COMMON_ARGS,
    "num_queries": _num_queries,
    "num_feature_levels": "model.transformer.num_feature_levels",
    "enc_n_points": "model.transformer.enc_n_points",
    "dec_n_points": "model.transformer.dec_n_points",
    "with_box_refine": "model.with_box_refine",
    "two_stage": "model.two_stage",
    "cls_loss_coef": "loss.ce_loss_coef",
    "focal_alpha": "loss.focal_alpha",
    "lr_linear_proj_mult": "train.lr_linear_proj_mult",
    "lr_linear_proj_names": "train.lr_linear_proj_names",
    # position_embedding_scale is not mapped: the official sine encoding ignores it
    # (it always uses 2 * pi), and so must a faithful conversion.
}

ENCODER_ATTN = "transformer.encoder.layers.0.self_attn"
DECODER_ATTN = "transformer.decoder.layers.0.cross_attn"


def _is_deformable(state: dict[str, Tensor]) -> bool:
    return "transformer.level_embed" in state and "input_proj.0.0.weight" in state


def _infer_deformable(state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    levels, hidden = state["transformer.level_embed"].shape
    num_proj = count_indexed(state, "input_proj.")
    if num_proj != levels:
        raise CheckpointError(
            f"The checkpoint has {num_proj} input projections but {levels} level embeddings; it is not a "
            "Deformable-DETR checkpoint this converter understands."
        )
    with_box_refine = "transformer.decoder.bbox_embed.0.layers.0.weight" in state
    two_stage = "transformer.enc_output.weight" in state
    hard: dict[str, Any] = {
        "model.arch": "deformable_detr",
        "model.backbone.name": infer_resnet(state),
        "model.num_classes": state["class_embed.0.weight"].shape[0],
        "model.with_box_refine": with_box_refine,
        "model.two_stage": two_stage,
        "model.transformer.hidden_dim": hidden,
        "model.transformer.num_feature_levels": levels,
        "model.transformer.enc_layers": count_indexed(state, "transformer.encoder.layers."),
        "model.transformer.dec_layers": count_indexed(state, "transformer.decoder.layers."),
        "model.transformer.dim_feedforward": state["transformer.encoder.layers.0.linear1.weight"].shape[0],
    }
    if not two_stage:
        hard["model.num_queries"] = state["query_embed.weight"].shape[0]
    soft: dict[str, Any] = {"model.position.name": "sine", "data.contiguous_labels": False}
    if "backbone.1.row_embed.weight" in state:
        soft["model.position.name"] = "learned"
        hard["model.position.num_embeddings"] = state["backbone.1.row_embed.weight"].shape[0]
    return hard, soft


def _sampling_points(state: dict[str, Tensor], prefix: str, heads: int, levels: int) -> int:
    weights = state[f"{prefix}.attention_weights.weight"].shape[0]
    offsets = state[f"{prefix}.sampling_offsets.weight"].shape[0]
    if weights % (heads * levels) or offsets != 2 * weights:
        raise CheckpointError(
            f"'{prefix}' has {weights} attention weights and {offsets} sampling offsets per query, which do not "
            f"fit model.transformer.nheads={heads} heads x {levels} levels x points; set "
            "model.transformer.nheads to the number of heads the checkpoint was trained with (8 for the "
            "official models)."
        )
    return weights // (heads * levels)


def _complete_deformable(state: dict[str, Tensor], cfg: Config) -> dict[str, Any]:
    if not cfg.model.with_box_refine:  # the official single-stage model stores its one class and box head per layer
        for key in (k for k in state if re.match(r"(class|bbox)_embed\.[1-9]", k)):
            first = re.sub(r"^(\w+_embed)\.\d+\.", r"\1.0.", key)
            if first in state and not torch.equal(state[first], state[key]):
                raise CheckpointError(f"'{key}' differs from '{first}', but the official single-stage model shares "
                                      "that head; the file was not written by this layout.")  # fmt: skip
    t = cfg.model.transformer
    values = {}
    if f"{ENCODER_ATTN}.attention_weights.weight" in state:
        values["model.transformer.enc_n_points"] = _sampling_points(state, ENCODER_ATTN, t.nheads, t.num_feature_levels)
    if f"{DECODER_ATTN}.attention_weights.weight" in state:
        values["model.transformer.dec_n_points"] = _sampling_points(state, DECODER_ATTN, t.nheads, t.num_feature_levels)
    return values


OFFICIAL_FORMATS.register("deformable_detr")(
    OfficialFormat(
        name="Deformable-DETR",
        arch="deformable_detr",
        matches=_is_deformable,
        infer=_infer_deformable,
        key_map=DEFORMABLE_KEY_MAP,
        args_map=DEFORMABLE_ARGS,
        complete=_complete_deformable,
        # Heads x points is all the sampling offsets tell; two-stage weights do not tell the proposals kept.
        untold=lambda hard: (
            ["model.transformer.nheads"]
            + (["model.transformer.two_stage_num_proposals"] if hard.get("model.two_stage") else [])
        ),
    )
)
