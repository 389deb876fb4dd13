"""Building Deformable-DETR, its criterion and its post-processor from a config."""

from __future__ import annotations

from detr_peg.config.schema import Config, ModelConfig
from detr_peg.errors import ConfigError
from detr_peg.models.attention import MultiheadAttention
from detr_peg.models.backbones import build_backbone
from detr_peg.models.criterion import SetCriterion, build_weight_dict
from detr_peg.models.deformable.decoder import DeformableDecoder, DeformableDecoderLayer
from detr_peg.models.deformable.deformable_detr import GROUP_NORM_GROUPS, DeformableDETR
from detr_peg.models.deformable.encoder import DeformableEncoder, DeformableEncoderLayer
from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.official_code import OFFICIAL
from detr_peg.models.deformable.options import DEFAULTS, OPTIONS
from detr_peg.models.deformable.transformer import DeformableTransformer
from detr_peg.models.detr.build import require_num_classes
from detr_peg.models.matcher import HungarianMatcher
from detr_peg.models.position import build_position_encoding
from detr_peg.models.postprocess import TopKPostProcess
from detr_peg.models.registry import Architecture, AttentionImpls, register_architecture


def default_out_stages(num_feature_levels: int) -> list[int]:
    """Stages when ``model.backbone.out_stages`` is unset: C3-C5 (official), C4-C5 for two levels, C5 for one."""
    if num_feature_levels <= 1:
        return [4]
    return [2, 3, 4][-min(num_feature_levels, 3) :]


def _check(m: ModelConfig) -> None:
    t = m.transformer
    if t.hidden_dim % t.nheads:
        raise ConfigError(
            f"model.transformer.hidden_dim {t.hidden_dim} is not divisible by model.transformer.nheads {t.nheads}."
        )
    if t.hidden_dim % GROUP_NORM_GROUPS:
        raise ConfigError(
            f"model.transformer.hidden_dim {t.hidden_dim} must be a multiple of {GROUP_NORM_GROUPS} "
            "for the GroupNorm of the Deformable-DETR input projections."
        )
    if t.enc_layers < 1:  # DETR can do without an encoder; the deformable decoder samples encoder memory
        raise ConfigError(f"model.transformer.enc_layers must be at least 1 for Deformable-DETR, got {t.enc_layers}.")
    if m.two_stage and not m.with_box_refine:
        raise ConfigError("model.two_stage needs model.with_box_refine=true (as in the official Deformable-DETR).")
    stages = m.backbone.out_stages
    if stages is not None and len(stages) > t.num_feature_levels:
        raise ConfigError(
            f"model.backbone.out_stages {stages} gives {len(stages)} levels but "
            f"model.transformer.num_feature_levels is {t.num_feature_levels}; use at most that many stages."
        )


def build_deformable_detr(m: ModelConfig) -> DeformableDETR:
    """Build :class:`DeformableDETR` from a config's ``model`` section."""
    _check(m)
    t = m.transformer
    num_classes = require_num_classes(m)
    backbone = build_backbone(m.backbone, m.backbone.out_stages or default_out_stages(t.num_feature_levels))
    position = build_position_encoding(
        m.position, dim=t.hidden_dim, num_levels=t.num_feature_levels, num_layers=t.enc_layers
    )
    d, levels = t.hidden_dim, t.num_feature_levels
    encoder_layer = DeformableEncoderLayer(
        self_attn=MSDeformAttn(d_model=d, n_levels=levels, n_heads=t.nheads, n_points=t.enc_n_points),
        d_model=d,
        dim_feedforward=t.dim_feedforward,
        dropout=t.dropout,
        activation=t.activation,
    )
    decoder_layer = DeformableDecoderLayer(
        self_attn=MultiheadAttention(d, t.nheads, dropout=t.dropout),
        cross_attn=MSDeformAttn(d_model=d, n_levels=levels, n_heads=t.nheads, n_points=t.dec_n_points),
        d_model=d,
        dim_feedforward=t.dim_feedforward,
        dropout=t.dropout,
        activation=t.activation,
    )
    transformer = DeformableTransformer(
        encoder=DeformableEncoder(layer=encoder_layer, num_layers=t.enc_layers),
        decoder=DeformableDecoder(layer=decoder_layer, num_layers=t.dec_layers),
        position=position,
        d_model=d,
        num_feature_levels=levels,
        two_stage=m.two_stage,
        two_stage_num_proposals=t.two_stage_num_proposals,
    )
    num_queries = t.two_stage_num_proposals if m.two_stage else m.num_queries
    return DeformableDETR(
        backbone=backbone,
        transformer=transformer,
        num_classes=num_classes,
        num_queries=num_queries,
        aux_loss=m.aux_loss,
        with_box_refine=m.with_box_refine,
        two_stage=m.two_stage,
        mask_rule=m.mask_rule,
    )


def build_deformable_criterion(cfg: Config) -> SetCriterion:
    """The Deformable-DETR loss (focal); ``*_enc`` terms weighted whenever two-stage (officially only with aux loss)."""
    loss = cfg.loss
    matcher = HungarianMatcher(
        cost_class=loss.set_cost_class,
        cost_bbox=loss.set_cost_bbox,
        cost_giou=loss.set_cost_giou,
        class_cost="focal",
        focal_alpha=loss.focal_alpha,
        focal_gamma=loss.focal_gamma,
    )
    num_aux = cfg.model.transformer.dec_layers - 1 if cfg.model.aux_loss else 0
    weight_dict = build_weight_dict(
        ce=loss.ce_loss_coef,
        bbox=loss.bbox_loss_coef,
        giou=loss.giou_loss_coef,
        num_aux=num_aux,
        two_stage=cfg.model.two_stage,
    )
    return SetCriterion(
        num_classes=require_num_classes(cfg.model),
        matcher=matcher,
        weight_dict=weight_dict,
        class_loss="focal",
        focal_alpha=loss.focal_alpha,
        focal_gamma=loss.focal_gamma,
    )


def build_deformable_postprocessor(cfg: Config) -> TopKPostProcess:
    """Top-``eval.num_select`` (query, class) pairs per image by sigmoid score."""
    return TopKPostProcess(num_select=cfg.eval.num_select)


register_architecture(
    "deformable_detr",
    Architecture(
        build_model=build_deformable_detr,
        build_criterion=build_deformable_criterion,
        build_postprocessor=build_deformable_postprocessor,
        options=OPTIONS,
        defaults=DEFAULTS,
        # The Triton kernels and the default path are compared on GPUs; the export traces per-level grid_sample
        # (ONNX GridSample, see ms_deform_attn_grid_sample.py); FLOPs are counted with grid_sample (the default
        # path's sparse backward counts as dense products).
        attention=AttentionImpls(
            module=MSDeformAttn,
            compared_on_gpu=("triton", "embedding_bag"),
            export="grid_sample_sum",
            flop_count="grid_sample",
        ),
        official=OFFICIAL,
        detectron2_name="DeformableDetrPeg",
    ),
)
