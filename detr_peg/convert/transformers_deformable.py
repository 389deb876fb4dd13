"""Reading Transformers' ``DeformableDetrForObjectDetection`` checkpoints: single-stage, box refinement, two-stage.

A head stored under two names must be one tensor; a missing per-layer head is the first one stored.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from detr_peg.convert.key_map import KeyMap
from detr_peg.convert.registry import TRANSFORMERS_FORMATS, TransformersFormat
from detr_peg.convert.transformers_config import backbone_values, refusal, transformer_values
from detr_peg.convert.transformers_keys import FC, OUT_PROJ, POSITION_RULES, RESNET_RULES, ROW_TABLES, TIMM_RULES

LAYERS = r"model\.(encoder|decoder)\.layers\.(\d+)\."
ENCODER = r"model\.encoder\.layers\.(\d+)\."
DECODER = r"model\.decoder\.layers\.(\d+)\."
TWO_STAGE_MODULES = r"(reference_points|enc_output|enc_output_norm|pos_trans|pos_trans_norm)"

DEFORMABLE_TRANSFORMERS_KEY_MAP = KeyMap(
    [
        *RESNET_RULES,
        *TIMM_RULES,
        *POSITION_RULES,
        (r"model\.input_proj\.(\d+)\.0\.(weight|bias)", r"input_proj.\1.conv.\2"),
        (r"model\.input_proj\.(\d+)\.1\.(weight|bias)", r"input_proj.\1.norm.\2"),
        (r"model\.level_embed", "transformer.level_embed"),
        (r"model\.query_position_embeddings\.weight", "query_embed.weight"),
        (rf"model\.{TWO_STAGE_MODULES}\.(weight|bias)", r"transformer.\1.\2"),
        (ENCODER + r"self_attn\.(.*)", r"transformer.encoder.layers.\1.self_attn.\2"),
        (ENCODER + r"self_attn_layer_norm\.(.*)", r"transformer.encoder.layers.\1.norm1.\2"),
        (ENCODER + r"final_layer_norm\.(.*)", r"transformer.encoder.layers.\1.norm2.\2"),
        (DECODER + rf"self_attn\.{OUT_PROJ}\.(weight|bias)", r"transformer.decoder.layers.\1.self_attn.out_proj.\2"),
        (DECODER + r"self_attn\.(in_proj_weight|in_proj_bias)", r"transformer.decoder.layers.\1.self_attn.\2"),
        (DECODER + r"encoder_attn\.(.*)", r"transformer.decoder.layers.\1.cross_attn.\2"),
        (DECODER + r"encoder_attn_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm1.\2"),
        (DECODER + r"self_attn_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm2.\2"),
        (DECODER + r"final_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm3.\2"),
        (LAYERS + rf"{FC}1\.(.*)", r"transformer.\1.layers.\2.linear1.\3"),
        (LAYERS + rf"{FC}2\.(.*)", r"transformer.\1.layers.\2.linear2.\3"),
        (r"(?:model\.decoder\.)?(class_embed|bbox_embed)\.(\d+)\.(.*)", r"\1.\2.\3"),
    ]
)

CLASS_HEAD = re.compile(r"(?:model\.decoder\.)?class_embed\.\d+\.weight")


def read_deformable(
    config: dict[str, Any], state: dict[str, Tensor], src: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(hard, soft)`` config values; ``CheckpointError`` naming an unrepresentable field."""
    hard, soft = transformer_values(config, src)
    levels = config.get("num_feature_levels", 4)
    refine, two_stage = bool(config.get("with_box_refine")), bool(config.get("two_stage"))
    if two_stage and not refine:
        raise refusal(src, "two_stage", True, "needs with_box_refine=true (as in the official Deformable-DETR)")
    indices = [2, 3, 4] if levels > 1 else [4]
    backbone = backbone_values(config, state, src, default_indices=indices, last_only=levels == 1)
    if len(backbone["model.backbone.out_stages"]) > levels:
        raise refusal(
            src, "num_feature_levels", levels, f"is fewer than the backbone's {backbone['model.backbone.out_stages']}"
        )
    hard.update(backbone)
    queries = config.get("num_queries", 300)
    hard.update(
        {
            "model.arch": "deformable_detr",
            "model.with_box_refine": refine,
            "model.two_stage": two_stage,
            "model.transformer.num_feature_levels": levels,
            "model.transformer.enc_n_points": config.get("encoder_n_points", 4),
            "model.transformer.dec_n_points": config.get("decoder_n_points", 4),
            "model.transformer.two_stage_num_proposals": config.get("two_stage_num_proposals", 300),
        }
    )
    # In two-stage the proposals are the queries; num_queries only sizes the unused query table.
    (soft if two_stage else hard)["model.num_queries"] = queries
    head = next((value for key, value in state.items() if CLASS_HEAD.fullmatch(key)), None)
    if head is not None:
        hard["model.num_classes"] = head.shape[0]
    rows = next((state[k] for k in ROW_TABLES if k in state), None)
    if rows is not None:
        hard["model.position.num_embeddings"] = rows.shape[0]
    return hard, soft


def fill_tied_heads(mapped: dict[str, Tensor], cfg: Any) -> None:
    """Add, in place, each missing ``{class,bbox}_embed.{i}`` as the first head the file holds."""
    heads = cfg.model.transformer.dec_layers + (1 if cfg.model.two_stage else 0)
    for kind in ("class_embed", "bbox_embed"):
        stored = {index for index in range(heads) if any(k.startswith(f"{kind}.{index}.") for k in mapped)}
        if not stored:
            continue
        prefix = f"{kind}.{min(stored)}."
        first = {k[len(prefix) :]: v for k, v in mapped.items() if k.startswith(prefix)}
        for index in sorted(set(range(heads)) - stored):
            mapped.update({f"{kind}.{index}.{suffix}": value for suffix, value in first.items()})


TRANSFORMERS_FORMATS.register("deformable_detr")(
    TransformersFormat(
        name="Transformers Deformable-DETR",
        model_type="deformable_detr",
        architecture="DeformableDetrForObjectDetection",
        arch="deformable_detr",
        read=read_deformable,
        key_map=DEFORMABLE_TRANSFORMERS_KEY_MAP,
        fill=fill_tied_heads,
    )
)
