"""The typed configuration of detr_peg: one dataclass per section.

A config is data. YAML files in ``configs/`` and ``key=value`` overrides are
validated against these dataclasses by :mod:`detr_peg.config.loader`: unknown
keys and values of the wrong type are errors that name the file and the key.
The defaults here are the official DETR ones.

These sections hold what every architecture and encoding shares. Fields of one
detector family (Deformable-DETR's ``model.transformer.num_feature_levels``)
or one positional encoding (``model.position.peg_kernel``) are declared by
that family or encoding in subclasses of these sections and registered in
:mod:`detr_peg.config.options`, with the family's own defaults.

Every numeric field states its valid range (and, where its value sizes what
a run allocates, a memory estimate) in its metadata (:mod:`detr_peg.config.ranges`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from detr_peg.config.ranges import (
    MIN_IMAGE_SIDE,
    batch_memory,
    classes_memory,
    eval_batch_memory,
    feedforward_memory,
    heads_memory,
    query_memory,
    train_scales_memory,
    transformer_width_memory,
    val_scale_memory,
    valid,
)

#: Data-loader worker processes per training process, at most.
MAX_WORKERS = 1024

#: Largest seed: NumPy takes seeds below 2**32, and the seed is offset by the process rank.
MAX_SEED = 2**31 - 1


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
    weights: str | None = None
    norm: Literal["frozen_bn", "bn", "sync_bn"] = "frozen_bn"
    dilation: bool = False
    frozen_stages: int = field(default=1, metadata=valid(0))
    out_stages: list[int] | None = field(default=None, metadata=valid(1, non_empty=True))
    train: bool = True
    memory_format: Literal["contiguous", "channels_last"] = "contiguous"


@dataclass
class PositionConfig:
    """The positional encoding, chosen by name from ``POSITION_ENCODINGS``.

    Each encoding's options are fields of its own subclass of this section,
    defined and registered in the encoding's module
    (``detr_peg/models/position/<name>.py``).

    Attributes:
        name: ``sine``, ``learned``, ``none`` or ``peg``.
    """

    name: str = "sine"


@dataclass
class TransformerConfig:
    """Transformer sizes shared by every architecture (each may add its own fields).

    Attributes:
        hidden_dim: token width ``d``.
        nheads: attention heads.
        enc_layers: encoder layers.
        dec_layers: decoder layers.
        dim_feedforward: hidden width of the feed-forward blocks.
        dropout: dropout in attention and feed-forward blocks.
        activation: feed-forward activation (``relu`` or ``gelu``).
    """

    hidden_dim: int = field(default=256, metadata=valid(1, memory=transformer_width_memory))
    nheads: int = field(default=8, metadata=valid(1, memory=heads_memory))
    enc_layers: int = field(default=6, metadata=valid(0, memory=transformer_width_memory))
    dec_layers: int = field(default=6, metadata=valid(1, memory=transformer_width_memory))
    dim_feedforward: int = field(default=2048, metadata=valid(1, memory=feedforward_memory))
    dropout: float = field(default=0.1, metadata=valid(0, 1, high_open=True))
    activation: Literal["relu", "gelu"] = "relu"


@dataclass
class ModelConfig:
    """The detector (each architecture may add its own fields).

    Attributes:
        arch: ``detr`` or ``deformable_detr`` (``MODELS`` registry).
        num_classes: number of class logits without "no object". ``None``: taken
            from the dataset (the largest category id + 1 for DETR-style
            official checkpoints, or the number of categories with
            ``data.contiguous_labels``).
        num_queries: object queries.
        aux_loss: return and supervise every decoder layer's predictions.
        mask_rule: how each feature level's padding mask is derived from the
            image mask (:mod:`detr_peg.models.masking`): ``nearest``, the
            official rule (nearest interpolation from the padded canvas), or
            ``stride``, which follows the convolutions' geometry
            (``ceil(size / stride)`` valid cells) on any canvas. They agree on
            canvases that are multiples of the coarsest stride, which is how
            every batch is padded.
    """

    arch: str = "detr"
    num_classes: int | None = field(default=None, metadata=valid(1, memory=classes_memory))
    num_queries: int = field(default=100, metadata=valid(1, memory=query_memory))
    aux_loss: bool = True
    mask_rule: Literal["nearest", "stride"] = "nearest"
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
    """

    set_cost_class: float = field(default=1.0, metadata=valid(0))
    set_cost_bbox: float = field(default=5.0, metadata=valid(0))
    set_cost_giou: float = field(default=2.0, metadata=valid(0))
    ce_loss_coef: float = field(default=1.0, metadata=valid(0))
    bbox_loss_coef: float = field(default=5.0, metadata=valid(0))
    giou_loss_coef: float = field(default=2.0, metadata=valid(0))


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
        train_size_per: ``image`` draws a short side from ``train_scales``
            for each training image, so a batch mixes sizes and is padded to
            its largest image (DETR's recipe); ``batch`` draws one for the
            whole batch, the same in every process (the batch-level
            multi-scale of RT-DETR), so the padded batch, and with it the
            token grid, changes from batch to batch.
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

    train_images: str | None = None
    train_annotations: str | None = None
    val_images: str | None = None
    val_annotations: str | None = None
    contiguous_labels: bool = True
    train_scales: list[int] = field(
        default_factory=lambda: list(range(480, 801, 32)),
        metadata=valid(MIN_IMAGE_SIDE, memory=train_scales_memory, non_empty=True),
    )
    train_max_size: int = field(default=1333, metadata=valid(MIN_IMAGE_SIDE))
    train_size_per: Literal["image", "batch"] = "image"
    crop_scales: list[int] = field(
        default_factory=lambda: [400, 500, 600], metadata=valid(MIN_IMAGE_SIDE, non_empty=True)
    )
    crop_size: list[int] = field(default_factory=lambda: [384, 600], metadata=valid(1, non_empty=True))
    crop_prob: float = field(default=0.5, metadata=valid(0, 1))
    hflip_prob: float = field(default=0.5, metadata=valid(0, 1))
    val_scale: int = field(default=800, metadata=valid(MIN_IMAGE_SIDE, memory=val_scale_memory))
    val_max_size: int = field(default=1333, metadata=valid(MIN_IMAGE_SIDE))
    num_workers: int = field(default=2, metadata=valid(0, MAX_WORKERS))
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
        warmup_iters: linear learning-rate warm-up over this many first
            iterations, from 0.001 times every learning rate to its value
            (0: none; at least 0).
        clip_max_norm: gradient clipping max norm (0 disables).
        ema_decay: keep an exponential moving average of the weights with this
            decay (0: off; RT-DETR uses 0.9999), evaluate it and store it as the
            checkpoint's weights (:mod:`detr_peg.engine.weight_average`).
        ema_warmup_iters: the average's decay ramps up as
            ``ema_decay * (1 - exp(-updates / ema_warmup_iters))`` (0: no ramp).
        amp: mixed precision of the forward pass: ``none``; ``bf16`` (a GPU
            with bfloat16, or a CPU with AMX or AVX512-BF16); ``fp16`` (GPU,
            with loss scaling); ``auto``: ``bf16`` where the device computes
            it natively, else ``none``. The loss runs in float32 either way.
        compile: wrap the model in ``torch.compile``.
        seed: random seed (offset by the process rank).
        deterministic: use deterministic algorithms (for exact resume checks).
        resume: continue from the last checkpoint in ``output_dir``.
        init_from: weights to start from (a detr_peg checkpoint), e.g. for
            fine-tuning. A checkpoint with another positional encoding (a
            converted sine DETR for a ``peg`` run) loads every weight but the
            encoding's own, which start fresh.
        reset_classifier: with ``init_from``: allow a different number of classes
            by re-initialising the class head.
        eval_every: evaluate every this many epochs (0: only at the end).
        eval_every_iters: also evaluate every this many iterations, within
            epochs too (0: off); for learning curves of short runs. Each
            evaluation appends an ``eval`` record with the iteration to
            ``metrics.jsonl``.
        checkpoint_every: also write the checkpoint every this many iterations
            within an epoch, so ``resume`` continues mid-epoch (0: at the end
            of each epoch only).
        log_every: iterations between metric log lines.
        tensorboard: also write TensorBoard events.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    """

    output_dir: str = "outputs/run"
    epochs: int = field(default=50, metadata=valid(1))
    max_iters: int | None = field(default=None, metadata=valid(1))
    batch_size: int = field(default=4, metadata=valid(1, memory=batch_memory))
    total_batch_size: int | None = field(default=None, metadata=valid(1))
    lr: float = field(default=1e-4, metadata=valid(0))
    lr_backbone: float = field(default=2e-5, metadata=valid(0))
    lr_linear_proj_mult: float = field(default=0.1, metadata=valid(0))
    lr_linear_proj_names: list[str] = field(default_factory=lambda: ["sampling_offsets", "reference_points"])
    weight_decay: float = field(default=1e-4, metadata=valid(0))
    lr_drop: int = field(default=40, metadata=valid(1))
    lr_gamma: float = field(default=0.1, metadata=valid(0, 1))
    warmup_iters: int = field(default=0, metadata=valid(0))
    clip_max_norm: float = field(default=0.1, metadata=valid(0))
    ema_decay: float = field(default=0.0, metadata=valid(0, 1, high_open=True))
    ema_warmup_iters: int = field(default=2000, metadata=valid(0))
    amp: Literal["none", "auto", "bf16", "fp16"] = "none"
    compile: bool = False
    seed: int = field(default=42, metadata=valid(0, MAX_SEED))
    deterministic: bool = False
    resume: bool = False
    init_from: str | None = None
    reset_classifier: bool = False
    eval_every: int = field(default=1, metadata=valid(0))
    eval_every_iters: int = field(default=0, metadata=valid(0))
    checkpoint_every: int = field(default=0, metadata=valid(0))
    log_every: int = field(default=20, metadata=valid(1))
    tensorboard: bool = False
    device: str = "auto"


@dataclass
class EvalConfig:
    """Evaluation and prediction (each architecture may add its own fields).

    Attributes:
        batch_size: images per process during evaluation.
        score_threshold: ``predict``: detections below this score are not drawn.
        padding_mode: ``mixed`` batches images in dataset order, padded to the
            largest of each batch; ``exact`` batches only images of equal size,
            so no image is padded and the outputs equal those of one image at a
            time (see the documentation, "Evaluation", "Padding").
        extra_padding: grow every evaluation batch by this fraction of its
            height and width (zeros on the right and bottom, masked) before
            the model sees it: a model trained on batches of mixed sizes saw
            most images on a padded canvas. 0 evaluates the batches as they
            are. Every evaluation of a run and ``detr-peg eval`` use it (the
            padding comparison, ``eval --padding``, sets its own).
    """

    batch_size: int = field(default=2, metadata=valid(1, memory=eval_batch_memory))
    score_threshold: float = field(default=0.5, metadata=valid(0, 1))
    padding_mode: Literal["mixed", "exact"] = "mixed"
    extra_padding: float = field(default=0.0, metadata=valid(0, 4))


@dataclass
class Config:
    """The whole configuration of a run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
