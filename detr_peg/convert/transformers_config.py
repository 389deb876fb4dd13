"""Reading the shared fields of a Transformers DETR / Deformable-DETR ``config.json`` into detr_peg config values.

Training-only settings are not carried over; a setting detr_peg cannot represent is refused naming the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch import Tensor

from detr_peg.bounded_read import parse_json, read_bounded_bytes
from detr_peg.convert.detr import RESNET_DEPTHS
from detr_peg.convert.transformers_keys import is_resnet_layout
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import CheckpointError
from detr_peg.models.backbones.timm_backbone import layout_model, stage_levels

#: The timm ResNets whose layout and names are torchvision's: they become ``model.backbone.source=torchvision``.
TORCHVISION_RESNETS = set(RESNET_DEPTHS.values())
#: Channels of torchvision's ResNet stages, by block type (``backbone_config.layer_type``).
RESNET_WIDTHS = {"basic": [64, 128, 256, 512], "bottleneck": [256, 512, 1024, 2048]}
ACTIVATIONS = ("relu", "gelu")
#: The name Transformers' COCO models give the class ids that are no category.
UNUSED_ID = "N/A"
ENCODINGS = ("sine", "learned")


def refusal(src: str, field: str, value: Any, why: str) -> CheckpointError:
    """The ``CheckpointError`` for a ``config.json`` setting detr_peg cannot represent."""
    return CheckpointError(f"{src}: config.json has {field}={json.dumps(value)}, which {why}; it is not converted.")


def read_config_json(path: Path, src: str) -> dict[str, Any]:
    """The parsed ``config.json`` of a model folder; ``CheckpointError`` if unreadable or not an object."""
    raw = read_bounded_bytes(path, "Model config", "record", CheckpointError)
    data = parse_json(raw, path, "Model config", "record", CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{src}: config.json holds {type(data).__name__}, not a JSON object.")
    return data


def transformer_values(config: dict[str, Any], src: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(hard, soft)`` values of the shared transformer fields; ``CheckpointError`` for an unrepresentable one."""
    heads, ffn = config.get("encoder_attention_heads", 8), config.get("encoder_ffn_dim", 2048)
    for key, value, encoder_key, field in (
        ("decoder_attention_heads", heads, "encoder_attention_heads", "nheads"),
        ("decoder_ffn_dim", ffn, "encoder_ffn_dim", "dim_feedforward"),
    ):
        if config.get(key, value) != value:
            reason = f"differs from {encoder_key}={value} while detr_peg has one model.transformer.{field}"
            raise refusal(src, key, config[key], reason)
    activation = config.get("activation_function", "relu")
    if activation not in ACTIVATIONS:
        raise refusal(src, "activation_function", activation, f"is none of {', '.join(ACTIVATIONS)}")
    encoding = config.get("position_embedding_type", "sine")
    if encoding not in ENCODINGS:
        raise refusal(src, "position_embedding_type", encoding, f"is none of {', '.join(ENCODINGS)}")
    if config.get("num_channels", 3) != 3:
        raise refusal(src, "num_channels", config["num_channels"], "is not three (RGB) input channels")
    hard = {
        "model.transformer.hidden_dim": config.get("d_model", 256),
        "model.transformer.nheads": heads,
        "model.transformer.enc_layers": config.get("encoder_layers", 6),
        "model.transformer.dec_layers": config.get("decoder_layers", 6),
        "model.transformer.dim_feedforward": ffn,
        "model.transformer.activation": activation,
    }
    soft = {
        "model.position.name": encoding,
        "model.transformer.dropout": config.get("dropout", 0.1),
        "data.contiguous_labels": False,
    }
    return hard, soft


def backbone_values(
    config: dict[str, Any], state: dict[str, Tensor], src: str, *, default_indices: list[int], last_only: bool
) -> dict[str, Any]:
    """``model.backbone.*`` hard values of a Transformers checkpoint (frozen BatchNorm always).

    A timm or Transformers ResNet of torchvision's layout becomes ``source: torchvision``; another timm
    model ``source: timm``. ``default_indices``: timm feature indices when ``config.json`` names none.
    Raises ``CheckpointError`` for a backbone detr_peg cannot represent.
    """
    backbone = config.get("backbone_config") or {}
    kind = backbone.get("model_type") or ("timm_backbone" if config.get("use_timm_backbone", True) else "")
    if is_resnet_layout(state):
        values, stages = _resnet_values(backbone, src)
    elif kind == "timm_backbone":
        values, stages = _timm_values(config, backbone, src, default_indices)
    elif kind == "resnet":
        raise CheckpointError(
            f"{src}: config.json describes Transformers' ResNet (backbone_config) but the weights hold none "
            "(no model.backbone.conv_encoder.model.embedder.*); the folder's files do not belong together."
        )
    elif not backbone:
        raise refusal(
            src,
            "backbone",
            config.get("backbone"),
            "names a backbone checkpoint to load rather than describing it (backbone_config)",
        )
    else:
        raise refusal(src, "backbone_config.model_type", kind, "is neither a timm model nor Transformers' ResNet")
    return {
        **values,
        "model.backbone.norm": "frozen_bn",
        "model.backbone.out_stages": stages[-1:] if last_only else stages,
    }


def _resnet_values(backbone: dict[str, Any], src: str) -> tuple[dict[str, Any], list[int]]:
    if backbone.get("model_type", "resnet") != "resnet":
        raise refusal(
            src, "backbone_config.model_type", backbone["model_type"], "does not describe the ResNet the weights hold"
        )
    checks = [
        (
            "downsample_in_bottleneck",
            False,
            "strides the first 1x1 convolution of a block (ResNet v1), not the 3x3 one",
        ),
        ("downsample_in_first_stage", False, "strides the first stage, which torchvision's ResNet does not"),
        ("hidden_act", "relu", "is not the ReLU of torchvision's ResNet"),
        ("embedding_size", 64, "is not the 64-channel stem of torchvision's ResNet"),
        ("num_channels", 3, "is not three (RGB) input channels"),
    ]
    for field, expected, why in checks:
        if backbone.get(field, expected) != expected:
            raise refusal(src, f"backbone_config.{field}", backbone[field], why)
    layer_type = backbone.get("layer_type", "bottleneck")
    if layer_type not in RESNET_WIDTHS:
        raise refusal(src, "backbone_config.layer_type", layer_type, "is neither basic nor bottleneck")
    if backbone.get("hidden_sizes", RESNET_WIDTHS[layer_type]) != RESNET_WIDTHS[layer_type]:
        raise refusal(
            src, "backbone_config.hidden_sizes", backbone["hidden_sizes"], "are not the widths of torchvision's ResNet"
        )
    depths = tuple(backbone.get("depths", [3, 4, 6, 3]))
    name = RESNET_DEPTHS.get((depths, layer_type == "bottleneck"))
    if name is None:
        raise refusal(src, "backbone_config.depths", list(depths), "are the blocks of no torchvision ResNet")
    features = backbone.get("out_features") or [f"stage{i}" for i in backbone.get("out_indices") or [4]]
    stages = [int(f[5:]) for f in features if f in {"stage1", "stage2", "stage3", "stage4"}]
    if len(stages) != len(features):
        raise refusal(src, "backbone_config.out_features", features, "are not among stage1 ... stage4")
    return {"model.backbone.source": "torchvision", "model.backbone.name": name}, stages


def _timm_values(
    config: dict[str, Any], backbone: dict[str, Any], src: str, default_indices: list[int]
) -> tuple[dict[str, Any], list[int]]:
    # Transformers 5 keeps the timm model's settings in backbone_config; Transformers 4 at the top level.
    name = backbone.get("backbone") or config.get("backbone") or "resnet50"
    kwargs = config.get("backbone_kwargs") or {}
    indices = list(backbone.get("out_indices") or kwargs.get("out_indices") or default_indices)
    stride = backbone.get("output_stride") or kwargs.get("output_stride") or (16 if config.get("dilation") else None)
    field = "backbone_config.out_indices" if backbone else "backbone_kwargs.out_indices"
    info = layout_model(name).feature_info
    reductions = [entry["reduction"] for entry in info.info]
    stages = []
    for index in indices:
        stage = round(math.log2(reductions[index])) - 1 if 0 <= index < len(reductions) else 0
        if not 1 <= stage <= 4 or stage_levels(info, [stage], name, field) != [index]:
            raise refusal(src, field, indices, f"selects a feature map of timm model {name!r} that is no ResNet stage")
        stages.append(stage)
    plain = name.split(".")[0]  # a pretrained tag (resnet50.a1_in1k) does not change the modules
    if stride not in (None, 16, 32):
        raise refusal(src, "backbone_config.output_stride", stride, "is neither 32 nor the DC5 16")
    if plain in TORCHVISION_RESNETS:
        values = {"model.backbone.source": "torchvision", "model.backbone.name": plain}
        return {**values, "model.backbone.dilation": stride == 16}, stages
    if stride == 16:
        raise refusal(src, "backbone_config.output_stride", stride, "dilates a timm model, which detr_peg does not")
    return {"model.backbone.source": "timm", "model.backbone.name": name}, stages


def label_map_of(config: dict[str, Any], src: str) -> LabelMap:
    """The label map of ``id2label`` (label ``i`` = category id ``i``), leaving out ids named ``N/A``.

    Raises ``CheckpointError``: ``id2label`` missing, empty, or with non-integer keys.
    """
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise refusal(src, "id2label", id2label, "names no classes")
    named = {key: name for key, name in id2label.items() if name != UNUSED_ID}
    if not named:
        raise refusal(src, "id2label", id2label, f"names every class {UNUSED_ID}")
    try:
        return LabelMap(category_ids=[int(k) for k in named], names=list(named.values()), contiguous=False)
    except ValueError as exc:
        raise refusal(src, "id2label", id2label, f"does not map class ids to names ({exc})") from None
