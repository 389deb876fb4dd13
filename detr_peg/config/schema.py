"""The typed configuration of detr_peg: one dataclass per section.

A config is data. YAML files in ``configs/`` and ``key=value`` overrides are
validated against these dataclasses by :mod:`detr_peg.config.loader`: unknown
keys and values of the wrong type are errors that name the file and the key.
The defaults here are the official DETR ones; :mod:`detr_peg.config.defaults`
holds what differs for other architectures (``model.arch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class BackboneConfig:
    """The image backbone.

    Attributes:
        source: backbone family, a name in ``detr_peg.models.backbones.BACKBONES``
            (``torchvision`` ResNets, ``timm`` models).
        name: model name within the source (``resnet50``, ``convnext_tiny``...).
        weights: ``None`` (random init), a local file (``.pth``/``.safetensors``
            state dict of the backbone body), an ``http(s)://`` URL, or
            ``"pretrained"`` for the source's own ImageNet weights (needs network).
        norm: ``frozen_bn`` (statistics and affine fixed, as the official models;
            meant for pretrained weights), ``bn`` (trainable BatchNorm, for training
            from scratch) or ``sync_bn`` (``bn`` synchronised across processes).
        dilation: replace the stride of the last stage by dilation (DC5 models).
        frozen_stages: the stem and the first ``frozen_stages`` stages get no
            gradient; 1 is the official setting, 0 trains everything.
        out_stages: stages whose features the detector uses, 1-based (stage ``s``
            has stride ``2 ** (s + 1)``); ``None``: the architecture's default
            (DETR ``[4]``, Deformable-DETR ``[2, 3, 4]``). Stages after the last
            one listed are not built.
        train: whether the backbone is trained at all (``lr_backbone > 0``).
        memory_format: ``contiguous`` (NCHW, as the official models) or
            ``channels_last`` (NHWC, set in the R50 configs): the backbone's
            convolutions run about a third faster on the CPU (oneDNN) and suit
            GPU tensor cores; results equal the NCHW ones up to float rounding,
            not bit for bit (with the official R18 weights the features differ
            by up to 5e-5, while outputs, losses and gradients still match the
            official model at rtol 1e-4, atol 1e-5).
    """

    source: str = "torchvision"
    name: str = "resnet50"
    weights: Optional[str] = None
    norm: Literal["frozen_bn", "bn", "sync_bn"] = "frozen_bn"
    dilation: bool = False
    frozen_stages: int = 1
    out_stages: Optional[list[int]] = None
    train: bool = True
    memory_format: Literal["contiguous", "channels_last"] = "contiguous"


@dataclass
class PositionConfig:
    """The positional encoding, chosen by name from ``POSITION_ENCODINGS``.

    Attributes:
        name: ``sine``, ``learned``, ``none`` or ``peg``.
        temperature: sine wavelength base.
        normalize: sine: normalise cumulative positions to ``[0, scale]``.
        scale: sine: normalisation range; ``None`` means ``2 * pi``.
        offset: sine: added to the cumulative position before normalising;
            ``None`` means the architecture's official form (DETR 0.0,
            Deformable-DETR -0.5).
        num_embeddings: learned: rows/columns of the embedding tables (the
            largest feature map side it can encode).
        peg_layers: peg: 0-based encoder layer indices after which a PEG is
            applied (``[0]``: after the first layer, as in CPVT).
        peg_kernel: peg: depthwise convolution kernel size (odd).
    """

    name: str = "sine"
    temperature: float = 10000.0
    normalize: bool = True
    scale: Optional[float] = None
    offset: Optional[float] = None
    num_embeddings: int = 50
    peg_layers: list[int] = field(default_factory=lambda: [0])
    peg_kernel: int = 3


@dataclass
class TransformerConfig:
    """Transformer sizes; deformable-only fields are ignored by DETR.

    Attributes:
        hidden_dim: token width ``d``.
        nheads: attention heads.
        enc_layers: encoder layers.
        dec_layers: decoder layers.
        dim_feedforward: hidden width of the feed-forward blocks.
        dropout: dropout in attention and feed-forward blocks.
        activation: feed-forward activation (``relu``, ``gelu``, ``glu``).
        pre_norm: DETR: LayerNorm before each block instead of after.
        num_feature_levels: Deformable: feature levels (backbone stages plus
            strided extra levels).
        enc_n_points: Deformable: sampling points per head and level, encoder.
        dec_n_points: Deformable: sampling points per head and level, decoder.
        two_stage_num_proposals: Deformable two-stage: proposals kept, which
            are the decoder queries (``model.num_queries`` is then unused).
    """

    hidden_dim: int = 256
    nheads: int = 8
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: Literal["relu", "gelu", "glu"] = "relu"
    pre_norm: bool = False
    num_feature_levels: int = 4
    enc_n_points: int = 4
    dec_n_points: int = 4
    two_stage_num_proposals: int = 300


@dataclass
class ModelConfig:
    """The detector.

    Attributes:
        arch: ``detr`` or ``deformable_detr`` (``MODELS`` registry).
        num_classes: number of class logits without "no object". ``None``: taken
            from the dataset (the largest category id + 1 for DETR-style
            official checkpoints, or the number of categories with
            ``data.contiguous_labels``).
        num_queries: object queries.
        aux_loss: return and supervise every decoder layer's predictions.
        with_box_refine: Deformable: iterative box refinement.
        two_stage: Deformable: encoder proposals (needs ``with_box_refine``).
    """

    arch: str = "detr"
    num_classes: Optional[int] = None
    num_queries: int = 100
    aux_loss: bool = True
    with_box_refine: bool = False
    two_stage: bool = False
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)


@dataclass
class LossConfig:
    """Hungarian matching costs and loss coefficients.

    Attributes:
        set_cost_class: matcher class cost weight.
        set_cost_bbox: matcher L1 box cost weight.
        set_cost_giou: matcher GIoU cost weight.
        ce_loss_coef: classification loss weight.
        bbox_loss_coef: L1 box loss weight.
        giou_loss_coef: GIoU loss weight.
        eos_coef: DETR: relative weight of the "no object" class.
        focal_alpha: Deformable: focal loss alpha.
        focal_gamma: Deformable: focal loss gamma.
    """

    set_cost_class: float = 1.0
    set_cost_bbox: float = 5.0
    set_cost_giou: float = 2.0
    ce_loss_coef: float = 1.0
    bbox_loss_coef: float = 5.0
    giou_loss_coef: float = 2.0
    eos_coef: float = 0.1
    focal_alpha: float = 0.25
    focal_gamma: float = 2.0


@dataclass
class DataConfig:
    """Datasets and augmentation.

    Attributes:
        train_images: folder of training images.
        train_annotations: COCO-format annotation JSON for training.
        val_images: folder of validation images.
        val_annotations: COCO-format annotation JSON for validation.
        contiguous_labels: map category ids to ``0..K-1`` (stored in the
            checkpoint, mapped back in predictions). ``False`` keeps the raw
            category ids as labels, as the official COCO models do.
        train_scales: short-side sizes drawn at random for training.
        train_max_size: longest side after resizing, training.
        crop_scales: short sides of the optional resize before the random crop.
        crop_size: ``[min, max]`` side of the random crop.
        crop_prob: probability of the resize-and-crop branch.
        hflip_prob: horizontal flip probability.
        val_scale: short side for evaluation.
        val_max_size: longest side for evaluation.
        num_workers: data loader worker processes per training process.
        on_bad_sample: ``error`` stops at an unreadable image or invalid
            annotation with a clear message; ``skip`` leaves the sample out,
            counts it and reports the count.
    """

    train_images: Optional[str] = None
    train_annotations: Optional[str] = None
    val_images: Optional[str] = None
    val_annotations: Optional[str] = None
    contiguous_labels: bool = True
    train_scales: list[int] = field(default_factory=lambda: list(range(480, 801, 32)))
    train_max_size: int = 1333
    crop_scales: list[int] = field(default_factory=lambda: [400, 500, 600])
    crop_size: list[int] = field(default_factory=lambda: [384, 600])
    crop_prob: float = 0.5
    hflip_prob: float = 0.5
    val_scale: int = 800
    val_max_size: int = 1333
    num_workers: int = 2
    on_bad_sample: Literal["error", "skip"] = "error"


@dataclass
class TrainConfig:
    """Optimisation and run control (the paper's recipe by default).

    Attributes:
        output_dir: folder for checkpoints, logs, metrics and the resolved config.
        epochs: training epochs.
        max_iters: stop after this many iterations in total (``None``: run all
            epochs); used by short runs such as the demo.
        batch_size: images per process; the total batch is
            ``batch_size * number of processes``.
        total_batch_size: the total batch the recipe was tuned for; a run whose
            total differs is reported at start (``None``: no check).
        lr: AdamW learning rate of the transformer and heads.
        lr_backbone: learning rate of the backbone.
        lr_linear_proj_mult: Deformable: factor on ``lr`` for parameters whose
            name contains one of ``lr_linear_proj_names``.
        lr_linear_proj_names: see ``lr_linear_proj_mult``.
        weight_decay: AdamW weight decay.
        lr_drop: StepLR step (epochs).
        lr_gamma: StepLR factor.
        clip_max_norm: gradient clipping max norm (0 disables).
        amp: mixed precision on GPU: ``none``, ``bf16`` or ``fp16``.
        compile: wrap the model in ``torch.compile``.
        seed: random seed (offset by the process rank).
        deterministic: use deterministic algorithms (for exact resume checks).
        resume: continue from the last checkpoint in ``output_dir``.
        init_from: weights to start from (a detr_peg checkpoint), e.g. for
            fine-tuning.
        reset_classifier: with ``init_from``: allow a different number of classes
            by re-initialising the class head.
        eval_every: evaluate every this many epochs (0: only at the end).
        checkpoint_every: also write the checkpoint every this many iterations
            within an epoch, so ``resume`` continues mid-epoch (0: at the end
            of each epoch only).
        log_every: iterations between metric log lines.
        tensorboard: also write TensorBoard events.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    """

    output_dir: str = "outputs/run"
    epochs: int = 50
    max_iters: Optional[int] = None
    batch_size: int = 4
    total_batch_size: Optional[int] = None
    lr: float = 1e-4
    lr_backbone: float = 2e-5
    lr_linear_proj_mult: float = 0.1
    lr_linear_proj_names: list[str] = field(
        default_factory=lambda: ["sampling_offsets", "reference_points"]
    )
    weight_decay: float = 1e-4
    lr_drop: int = 40
    lr_gamma: float = 0.1
    clip_max_norm: float = 0.1
    amp: Literal["none", "bf16", "fp16"] = "none"
    compile: bool = False
    seed: int = 42
    deterministic: bool = False
    resume: bool = False
    init_from: Optional[str] = None
    reset_classifier: bool = False
    eval_every: int = 1
    checkpoint_every: int = 0
    log_every: int = 20
    tensorboard: bool = False
    device: str = "auto"


@dataclass
class EvalConfig:
    """Evaluation and prediction.

    Attributes:
        batch_size: images per process during evaluation.
        num_select: Deformable: detections kept per image (top-k over
            queries x classes).
        score_threshold: ``predict``: detections below this score are not drawn.
    """

    batch_size: int = 2
    num_select: int = 100
    score_threshold: float = 0.5


@dataclass
class Config:
    """The whole configuration of a run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
