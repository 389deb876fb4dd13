"""The typed configuration shared by every architecture and encoding: one dataclass per section, official
DETR defaults. Family and encoding fields are subclasses registered in :mod:`detr_peg.config.options`;
each numeric field's valid range is in its metadata (:mod:`detr_peg.config.ranges`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from detr_peg.config.ranges import MAX_CLASSES, MAX_TEST_SIDE, MIN_IMAGE_SIDE, valid

#: Data-loader worker processes per training process, at most.
MAX_WORKERS = 1024

#: Largest seed: NumPy takes seeds below 2**32, and the seed is offset by the process rank.
MAX_SEED = 2**31 - 1


@dataclass
class BackboneConfig:
    """The image backbone.

    Attributes:
        source: backbone family in ``detr_peg.models.backbones.BACKBONES`` (``torchvision``, ``timm``).
        name: model name within the source (``resnet50``, ``convnext_tiny``).
        weights: ``None`` (random), a ``.pth``/``.safetensors`` state dict, an ``http(s)://`` URL, or ``"pretrained"``.
        norm: ``frozen_bn`` (fixed, for pretrained weights), ``bn`` (trainable) or ``sync_bn`` (across processes).
        dilation: dilate instead of striding the last stage (DC5).
        frozen_stages: the stem and this many first stages get no gradient (0: train all).
        out_stages: 1-based stages the detector uses (stride ``2 ** (s + 1)``); ``None``: the architecture's.
        train: whether the backbone is trained at all.
        memory_format: ``contiguous`` (NCHW) or ``channels_last`` (NHWC; faster, equal up to float rounding).
    """

    source: str = "torchvision"
    name: str = "resnet50"
    weights: str | None = None
    norm: Literal["frozen_bn", "bn", "sync_bn"] = "frozen_bn"
    dilation: bool = False
    frozen_stages: int = field(default=1, metadata=valid(0))
    out_stages: list[int] | None = field(default=None, metadata=valid(1, non_empty=True, order="ascending"))
    train: bool = True
    memory_format: Literal["contiguous", "channels_last"] = "contiguous"


@dataclass
class PositionConfig:
    """The positional encoding, by name (``sine``, ``learned``, ``none``, ``peg``) from ``POSITION_ENCODINGS``.

    Each encoding's options are fields of its registered subclass (``detr_peg/models/position/<name>.py``).
    """

    name: str = "sine"


@dataclass
class TransformerConfig:
    """Transformer sizes shared by every architecture: width ``hidden_dim``, ``nheads``, ``enc_layers``,
    ``dec_layers``, feed-forward width ``dim_feedforward``, ``dropout`` and ``activation`` (``relu``/``gelu``).
    """

    hidden_dim: int = field(default=256, metadata=valid(1, 16384))
    nheads: int = field(default=8, metadata=valid(1, 1024))
    enc_layers: int = field(default=6, metadata=valid(0, 1000))
    dec_layers: int = field(default=6, metadata=valid(1, 1000))
    dim_feedforward: int = field(default=2048, metadata=valid(1, 1_000_000))
    dropout: float = field(default=0.1, metadata=valid(0, 1, high_open=True))
    activation: Literal["relu", "gelu"] = "relu"


@dataclass
class ModelConfig:
    """The detector.

    Attributes:
        arch: ``detr`` or ``deformable_detr`` (``MODELS`` registry).
        num_classes: class logits without "no object"; ``None``: from the dataset's label map.
        num_queries: object queries.
        aux_loss: return and supervise every decoder layer's predictions.
        mask_rule: level padding masks: ``nearest`` (official, interpolated) or ``stride`` (``ceil(size / stride)``).
    """

    arch: str = "detr"
    num_classes: int | None = field(default=None, metadata=valid(1, MAX_CLASSES))
    num_queries: int = field(default=100, metadata=valid(1, 100_000))
    aux_loss: bool = True
    mask_rule: Literal["nearest", "stride"] = "nearest"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)


@dataclass
class LossConfig:
    """Matcher costs (``set_cost_*``) and loss weights (``*_loss_coef``) of the class, L1 box and GIoU terms."""

    set_cost_class: float = field(default=1.0, metadata=valid(0))
    set_cost_bbox: float = field(default=5.0, metadata=valid(0))
    set_cost_giou: float = field(default=2.0, metadata=valid(0))
    ce_loss_coef: float = field(default=1.0, metadata=valid(0))
    bbox_loss_coef: float = field(default=5.0, metadata=valid(0))
    giou_loss_coef: float = field(default=2.0, metadata=valid(0))


@dataclass
class DataConfig:
    """Datasets and augmentation (sides in pixels).

    Attributes:
        train_images: folder of training images.
        train_annotations: COCO annotation JSON for training, or a YOLO ``data.yaml``.
        val_images: folder of validation images.
        val_annotations: COCO annotation JSON for validation, or a YOLO ``data.yaml``.
        contiguous_labels: map category ids to ``0..K-1``; ``False`` keeps raw ids (official COCO models).
        train_scales: short sides drawn at random for training.
        train_max_size: longest side after resizing, training.
        train_size_per: draw a ``train_scales`` side per ``image`` (DETR) or per ``batch`` (same in every process).
        crop_scales: short sides of the resize before the random crop.
        crop_size: ``[min, max]`` side of the random crop.
        crop_prob: probability of the resize-and-crop branch.
        hflip_prob: horizontal flip probability.
        val_scale: short side for evaluation.
        val_max_size: longest side for evaluation.
        num_workers: data loader worker processes per training process.
        on_bad_sample: ``error`` stops at a bad image or annotation; ``skip`` leaves it out and counts it.
    """

    train_images: str | None = None
    train_annotations: str | None = None
    val_images: str | None = None
    val_annotations: str | None = None
    contiguous_labels: bool = True
    train_scales: list[int] = field(
        default_factory=lambda: list(range(480, 801, 32)),
        metadata=valid(MIN_IMAGE_SIDE, MAX_TEST_SIDE, non_empty=True),
    )
    train_max_size: int = field(default=1333, metadata=valid(MIN_IMAGE_SIDE, MAX_TEST_SIDE))
    train_size_per: Literal["image", "batch"] = "image"
    crop_scales: list[int] = field(
        default_factory=lambda: [400, 500, 600], metadata=valid(MIN_IMAGE_SIDE, MAX_TEST_SIDE, non_empty=True)
    )
    crop_size: list[int] = field(
        default_factory=lambda: [384, 600], metadata=valid(1, MAX_TEST_SIDE, non_empty=True, order="min_max")
    )
    crop_prob: float = field(default=0.5, metadata=valid(0, 1))
    hflip_prob: float = field(default=0.5, metadata=valid(0, 1))
    val_scale: int = field(default=800, metadata=valid(MIN_IMAGE_SIDE, MAX_TEST_SIDE))
    val_max_size: int = field(default=1333, metadata=valid(MIN_IMAGE_SIDE, MAX_TEST_SIDE))
    num_workers: int = field(default=2, metadata=valid(0, MAX_WORKERS))
    on_bad_sample: Literal["error", "skip"] = "error"

    def files(self, splits: tuple[str, ...] = ("train", "val")) -> list[tuple[str | None, str]]:
        """``(path, key)`` of the image folders and annotation files of ``splits`` (what a run reads)."""
        return [(getattr(self, f"{s}_{w}"), f"data.{s}_{w}") for s in splits for w in ("images", "annotations")]


@dataclass
class TrainConfig:
    """Optimisation and run control (the paper's recipe by default).

    Attributes:
        output_dir: folder for checkpoints, logs, metrics and the resolved config.
        epochs: training epochs.
        max_iters: stop after this many iterations in total (``None``: all epochs).
        batch_size: images per process.
        total_batch_size: the total batch the recipe was tuned for; a differing run is reported (``None``: no check).
        lr: AdamW learning rate of the transformer and heads.
        lr_backbone: learning rate of the backbone.
        lr_linear_proj_mult: Deformable: ``lr`` factor for parameters named by ``lr_linear_proj_names``.
        lr_linear_proj_names: name fragments selecting those parameters.
        weight_decay: AdamW weight decay.
        lr_drop: StepLR step (epochs).
        lr_gamma: StepLR factor.
        warmup_iters: linear warm-up from 0.001 times each learning rate over this many iterations (0: none).
        clip_max_norm: gradient clipping max norm (0 disables).
        ema_decay: decay of an exponential moving average of the weights, evaluated and saved (0: off).
        ema_warmup_iters: the decay ramps as ``ema_decay * (1 - exp(-updates / ema_warmup_iters))`` (0: no ramp).
        amp: forward precision: ``none``, ``bf16``, ``fp16`` (GPU) or ``auto`` (native bf16); the loss stays float32.
        compile: wrap the model in ``torch.compile``.
        seed: random seed (offset by the process rank).
        deterministic: use deterministic algorithms.
        resume: continue from the last checkpoint in ``output_dir``.
        init_from: a detr_peg checkpoint to start from; another encoding's own weights start fresh.
        reset_classifier: with ``init_from``: re-initialise the class head (another number of classes).
        eval_every: evaluate every this many epochs (0: only at the end).
        eval_every_iters: also evaluate every this many iterations, within epochs (0: off).
        checkpoint_every: also checkpoint every this many iterations, for mid-epoch resume (0: off).
        save_best: keep the evaluated weights of the best evaluation by this metric in ``checkpoint_best.pth``.
        early_stop: end the run after this many evaluations without a better ``save_best`` metric (AP if unset;
            0: off).
        log_every: iterations between metric log lines.
        tensorboard: also write TensorBoard events.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    """

    output_dir: str = "outputs/run"
    epochs: int = field(default=50, metadata=valid(1))
    max_iters: int | None = field(default=None, metadata=valid(1))
    batch_size: int = field(default=4, metadata=valid(1, 100_000))
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
    save_best: (
        Literal["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"] | None
    ) = None
    early_stop: int = field(default=0, metadata=valid(0))
    log_every: int = field(default=20, metadata=valid(1))
    tensorboard: bool = False
    device: str = field(
        default="auto", metadata=valid(pattern=(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N"))
    )


@dataclass
class EvalConfig:
    """Evaluation and prediction.

    Attributes:
        batch_size: images per process.
        score_threshold: ``predict``: detections below this score are not drawn.
        padding_mode: ``mixed`` batches in dataset order; ``exact`` batches only equal sizes (no padding).
        extra_padding: grow every evaluation batch by this fraction of its height and width (masked zeros).
    """

    batch_size: int = field(default=2, metadata=valid(1, 100_000))
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
