"""Reading Transformers' ``DetrForObjectDetection`` checkpoints (post-norm; classes from the weights, last = no object).

``auxiliary_loss: true`` is refused: Transformers then layer-norms each decoder layer's input, so boxes differ.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from detr_peg.convert.key_map import KeyMap
from detr_peg.convert.registry import TRANSFORMERS_FORMATS, TransformersFormat
from detr_peg.convert.transformers_config import backbone_values, refusal, transformer_values
from detr_peg.convert.transformers_keys import FC, OUT_PROJ, POSITION_RULES, RESNET_RULES, ROW_TABLES, TIMM_RULES

LAYERS = r"model\.(encoder|decoder)\.layers\.(\d+)\."
DECODER = r"model\.decoder\.layers\.(\d+)\."

DETR_TRANSFORMERS_KEY_MAP = KeyMap(
    [
        *RESNET_RULES,
        *TIMM_RULES,
        *POSITION_RULES,
        (r"model\.input_projection\.(weight|bias)", r"input_proj.\1"),
        (r"model\.query_position_embeddings\.weight", "query_embed.weight"),
        (LAYERS + rf"self_attn\.{OUT_PROJ}\.(weight|bias)", r"transformer.\1.layers.\2.self_attn.out_proj.\3"),
        (LAYERS + r"self_attn\.(in_proj_weight|in_proj_bias)", r"transformer.\1.layers.\2.self_attn.\3"),
        (
            DECODER + rf"encoder_attn\.{OUT_PROJ}\.(weight|bias)",
            r"transformer.decoder.layers.\1.cross_attn.out_proj.\2",
        ),
        (DECODER + r"encoder_attn\.(in_proj_weight|in_proj_bias)", r"transformer.decoder.layers.\1.cross_attn.\2"),
        (r"model\.encoder\.layers\.(\d+)\.self_attn_layer_norm\.(.*)", r"transformer.encoder.layers.\1.norm1.\2"),
        (r"model\.encoder\.layers\.(\d+)\.final_layer_norm\.(.*)", r"transformer.encoder.layers.\1.norm2.\2"),
        (DECODER + r"self_attn_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm1.\2"),
        (DECODER + r"encoder_attn_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm2.\2"),
        (DECODER + r"final_layer_norm\.(.*)", r"transformer.decoder.layers.\1.norm3.\2"),
        (LAYERS + rf"{FC}1\.(.*)", r"transformer.\1.layers.\2.linear1.\3"),
        (LAYERS + rf"{FC}2\.(.*)", r"transformer.\1.layers.\2.linear2.\3"),
        (r"model\.decoder\.layernorm\.(.*)", r"transformer.decoder.norm.\1"),
        (r"class_labels_classifier\.(.*)", r"class_embed.\1"),
        (r"bbox_predictor\.(.*)", r"bbox_embed.\1"),
    ]
)

CLASS_HEAD = "class_labels_classifier.weight"


def read_detr(config: dict[str, Any], state: dict[str, Tensor], src: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(hard, soft)`` config values; ``CheckpointError`` naming an unrepresentable field."""
    if config.get("auxiliary_loss"):
        raise refusal(
            src,
            "auxiliary_loss",
            True,
            "makes Transformers' decoder pass each layer's layer-normed output on (the official DETR passes it "
            "unnormalised), so detr_peg would compute other boxes; set it to false to convert the weights for "
            "the official forward pass",
        )
    hard, soft = transformer_values(config, src)
    hard.update(backbone_values(config, state, src, default_indices=[1, 2, 3, 4], last_only=True))
    hard.update({"model.arch": "detr", "model.num_queries": config.get("num_queries", 100)})
    hard["model.transformer.pre_norm"] = False
    if CLASS_HEAD in state:
        hard["model.num_classes"] = state[CLASS_HEAD].shape[0] - 1  # the last output is "no object"
    rows = next((state[k] for k in ROW_TABLES if k in state), None)
    if rows is not None:
        hard["model.position.num_embeddings"] = rows.shape[0]
    return hard, soft


TRANSFORMERS_FORMATS.register("detr")(
    TransformersFormat(
        name="Transformers DETR",
        model_type="detr",
        architecture="DetrForObjectDetection",
        arch="detr",
        read=read_detr,
        key_map=DETR_TRANSFORMERS_KEY_MAP,
    )
)
