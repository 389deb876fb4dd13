"""Building DETR, its criterion and its post-processor from a config."""

from __future__ import annotations

from torch import nn

from detr_peg.config.schema import Config, ModelConfig
from detr_peg.errors import ConfigError
from detr_peg.models.backbones import build_backbone
from detr_peg.models.criterion import SetCriterion, build_weight_dict
from detr_peg.models.detr.detr import DETR
from detr_peg.models.detr.official_code import OFFICIAL
from detr_peg.models.detr.options import DEFAULTS, OPTIONS
from detr_peg.models.detr.transformer import Decoder, DecoderLayer, Encoder, EncoderLayer, Transformer
from detr_peg.models.matcher import HungarianMatcher
from detr_peg.models.position import build_position_encoding
from detr_peg.models.postprocess import PostProcess
from detr_peg.models.registry import Architecture, register_architecture


def require_num_classes(model: ModelConfig) -> int:
    """``model.num_classes``, or a clear error when it is still unset."""
    if model.num_classes is None:
        raise ConfigError(
            "model.num_classes is not set: it is taken from the dataset when training; "
            "set it explicitly (for example model.num_classes=91 for COCO ids) to build a model without data."
        )
    if model.num_classes < 1:
        raise ConfigError(f"model.num_classes must be at least 1, got {model.num_classes}.")
    return model.num_classes


def build_detr(m: ModelConfig) -> DETR:
    """Build :class:`DETR` from a config's ``model`` section."""
    t = m.transformer
    num_classes = require_num_classes(m)
    if t.hidden_dim % t.nheads:
        raise ConfigError(
            f"model.transformer.hidden_dim {t.hidden_dim} is not divisible by model.transformer.nheads {t.nheads}."
        )
    out_stages = m.backbone.out_stages or [4]
    if len(out_stages) > 1:  # the others would be computed and thrown away
        raise ConfigError(f"model.backbone.out_stages is {out_stages}, but DETR takes one stage; give one, such as "
                          f"[{out_stages[-1]}].")  # fmt: skip
    backbone = build_backbone(m.backbone, out_stages)
    position = build_position_encoding(m.position, dim=t.hidden_dim, num_levels=1, num_layers=t.enc_layers)
    args = (t.hidden_dim, t.nheads, t.dim_feedforward, t.dropout, t.activation, t.pre_norm)
    encoder = Encoder(EncoderLayer(*args), t.enc_layers, norm=nn.LayerNorm(t.hidden_dim) if t.pre_norm else None)
    decoder = Decoder(DecoderLayer(*args), t.dec_layers, norm=nn.LayerNorm(t.hidden_dim))
    transformer = Transformer(encoder=encoder, decoder=decoder, position=position, d_model=t.hidden_dim)
    return DETR(
        backbone=backbone,
        transformer=transformer,
        num_classes=num_classes,
        num_queries=m.num_queries,
        aux_loss=m.aux_loss,
        mask_rule=m.mask_rule,
    )


def build_detr_criterion(cfg: Config) -> SetCriterion:
    """The DETR loss: softmax class cost and cross-entropy with ``eos_coef``."""
    loss = cfg.loss
    matcher = HungarianMatcher(
        cost_class=loss.set_cost_class, cost_bbox=loss.set_cost_bbox, cost_giou=loss.set_cost_giou, class_cost="softmax"
    )
    num_aux = cfg.model.transformer.dec_layers - 1 if cfg.model.aux_loss else 0
    weight_dict = build_weight_dict(
        ce=loss.ce_loss_coef, bbox=loss.bbox_loss_coef, giou=loss.giou_loss_coef, num_aux=num_aux, two_stage=False
    )
    return SetCriterion(
        num_classes=require_num_classes(cfg.model),
        matcher=matcher,
        weight_dict=weight_dict,
        class_loss="ce",
        eos_coef=loss.eos_coef,
    )


def build_detr_postprocessor(cfg: Config) -> PostProcess:
    return PostProcess()


register_architecture(
    "detr",
    Architecture(
        build_model=build_detr,
        build_criterion=build_detr_criterion,
        build_postprocessor=build_detr_postprocessor,
        options=OPTIONS,
        defaults=DEFAULTS,
        official=OFFICIAL,
        detectron2_name="DetrPeg",
    ),
)
