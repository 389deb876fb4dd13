"""timm backbones (``model.backbone.source: timm``): any timm ``features_only`` model, stage ``s``
matched to its feature level at stride ``2 ** (s + 1)`` (docs/integrations.md). timm is imported
lazily: it is a large import every command would otherwise pay.
"""

from __future__ import annotations

import contextlib
import difflib

import torch
from torch import Tensor, nn

from detr_peg.config.schema import BackboneConfig
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.messages import install_hint
from detr_peg.models.backbones.base import MEMORY_FORMATS, Backbone
from detr_peg.models.backbones.registry import BACKBONES
from detr_peg.models.backbones.weights import (
    STRIP_PREFIXES,
    backbone_part,
    download_error,
    load_state_checked,
    read_backbone_state,
    strip_key_prefixes,
)

STAGES = (1, 2, 3, 4)
# Input side of the probes: two stride-32 cells, accepted by any model fit for detection.
PROBE_SIZE = 64


class TimmBackbone(Backbone):
    """A timm ``features_only`` model whose outputs are the requested levels; state-dict keys are ``body.`` + timm's.

    ``channels_last``: the body returns ``[B, H, W, C]`` maps (timm ``NHWC``), permuted to ``[B, C, H, W]``.
    """

    def __init__(
        self, *, body: nn.Module, out_channels: list[int], strides: list[int], channels_last: bool = False
    ) -> None:
        super().__init__()
        self.body = body
        self.out_channels = list(out_channels)
        self.strides = list(strides)
        self.channels_last = channels_last

    def forward(self, images: Tensor) -> list[Tensor]:
        """``Tensor[B, 3, H, W]`` -> ``[Tensor[B, C_l, H_l, W_l], ...]`` by increasing stride."""
        features = self.body(self.to_memory_format(images))
        if isinstance(features, dict):
            features = list(features.values())
        if self.channels_last:
            features = [f.permute(0, 3, 1, 2) for f in features]
        return list(features)


def check_timm_name(name: str) -> None:
    """Raise a :class:`ConfigError` with close matches when timm has no model ``name``."""
    import timm

    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f" Close names: {', '.join(close)}." if close else ""
    raise ConfigError(
        f"Unknown timm model {name!r} in model.backbone.name: list the available ones with "
        f"timm.list_models('*convnext*') (any pattern).{hint}"
    )


def layout_model(name: str) -> nn.Module:
    """The features model with all levels on the ``meta`` device (CPU if its constructor needs real values)."""
    import timm

    try:
        with torch.device("meta"):
            return timm.create_model(name, features_only=True, pretrained=False)
    except (NotImplementedError, RuntimeError):
        pass  # retried on the CPU, where a real error is reported
    try:
        return timm.create_model(name, features_only=True, pretrained=False)
    except RuntimeError as exc:
        raise ConfigError(f"timm model {name!r} cannot be used as a backbone ({exc}).") from None


def stage_levels(feature_info, stages: list[int], name: str, field: str) -> list[int]:
    """``feature_info`` indices of the levels at stride ``2 ** (s + 1)`` for each 1-based stage ``s``.

    Raises ConfigError, listing the model's strides, when a stage has no level with its stride.
    """
    reductions = [entry["reduction"] for entry in feature_info.info]
    indices = []
    for stage in stages:
        stride = 2 ** (stage + 1)
        matches = [i for i, r in enumerate(reductions) if r == stride]
        if not matches:
            raise ConfigError(
                f"{field}: stage {stage} needs a stride-{stride} feature map, but timm model {name!r} "
                f"has feature strides {sorted(set(reductions))}; choose stages among those strides "
                "(stage s has stride 2 ** (s + 1)) or a hierarchical model."
            )
        indices.append(matches[-1])
    return indices


def probe_forward(model: nn.Module, size: tuple[int, int] = (PROBE_SIZE, PROBE_SIZE)) -> list[Tensor]:
    """The feature maps of a zero image of ``size`` (H, W) in eval mode; ConfigError if the model refuses that size,
    NotImplementedError if an operation has no kernel on its device."""
    was_training = model.training
    model.eval()
    try:
        features = model(torch.zeros(1, 3, *size, device=next(model.parameters()).device))
    except NotImplementedError:
        raise  # an operation without a kernel on this device, not a property of the model
    except (AssertionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"timm model {model.pretrained_cfg.get('architecture', '')!r} does not accept a {size[0]}x{size[1]} "
            f"image ({' '.join(str(exc).split()).rstrip('.')}); detection backbones must take any image size: choose a convolutional or hierarchical "
            "model (resnet, convnext, efficientnet, ...)."
        ) from None
    finally:
        model.train(was_training)
    return list(features.values()) if isinstance(features, dict) else list(features)


def dependent_parameters(model: nn.Module, level: int) -> set[str]:
    """Names of the parameters that get a gradient from feature level ``level`` on a zero image.

    Raises ConfigError if the model refuses a ``PROBE_SIZE`` image; leaves the model's mode unchanged.
    """
    out_indices = list(model.feature_info.out_indices)
    if level not in out_indices:
        raise ValueError(f"level {level} is not among the model's outputs {out_indices}")
    params = dict(model.named_parameters())
    with torch.enable_grad():
        features = probe_forward(model)
        grads = torch.autograd.grad(features[out_indices.index(level)].sum(), list(params.values()), allow_unused=True)
    return {name for name, grad in zip(params, grads) if grad is not None}


def create_body(cfg: BackboneConfig, out_indices: list[int], layout: nn.Module) -> nn.Module:
    """The features model with ``cfg.weights``: None, ``"pretrained"``, or a file/URL of a timm/detr_peg state dict."""
    import timm

    kwargs = dict(features_only=True, out_indices=tuple(out_indices))
    if cfg.weights is None:
        return timm.create_model(cfg.name, pretrained=False, **kwargs)
    if cfg.weights == "pretrained":
        try:
            return timm.create_model(cfg.name, pretrained=True, **kwargs)
        except Exception as exc:  # download errors come in many types (URLError, huggingface_hub's, ...)
            raise download_error(f"timm's pretrained weights of {cfg.name!r}", exc) from None
    state = backbone_state(cfg.weights)
    layout_keys = set(layout.state_dict())
    if state.keys() <= layout_keys:
        # The body's own layout (a detr_peg checkpoint): load after dropping unbuilt stages.
        body = timm.create_model(cfg.name, pretrained=False, **kwargs)
        built = set(body.state_dict())
        load_state_checked(body, {k: v for k, v in state.items() if k in built}, cfg.weights)
        return body
    check_full_model_state(cfg.name, state, cfg.weights)
    # timm maps a whole-model state dict onto the features model (the same path as its own weights).
    return timm.create_model(cfg.name, pretrained=True, pretrained_cfg_overlay=dict(state_dict=state), **kwargs)


def backbone_state(spec: str) -> dict[str, Tensor]:
    """The backbone weights in ``spec``; of a detector checkpoint, only its ``backbone...body.`` part."""
    return strip_key_prefixes(backbone_part(read_backbone_state(spec)), STRIP_PREFIXES)


def check_full_model_state(name: str, state: dict[str, Tensor], source: str) -> None:
    """Raise CheckpointError unless ``state`` fits the whole timm model ``name`` (classifier optional)."""
    import timm

    with torch.device("meta"):
        full = timm.create_model(name, pretrained=False)
    classifiers = full.pretrained_cfg.get("classifier") or ()
    classifiers = (classifiers,) if isinstance(classifiers, str) else tuple(classifiers)
    head = tuple(f"{c}." for c in classifiers)
    own = {k: v for k, v in full.state_dict().items() if not k.endswith("num_batches_tracked")}
    given = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    missing = sorted(k for k in own.keys() - given.keys() if not k.startswith(head))
    unexpected = sorted(given.keys() - own.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"Backbone weights {source} fit neither timm model {name!r} (whole-model state dict) nor its "
            f"features backbone: {len(missing)} missing keys (first: {missing[:3]}), {len(unexpected)} "
            f"unexpected keys (first: {unexpected[:3]})."
        )
    for key, value in given.items():
        if not key.startswith(head) and own[key].shape != value.shape:
            raise CheckpointError(
                f"Backbone weights {source}: '{key}' has shape {tuple(value.shape)}, timm model {name!r} "
                f"expects {tuple(own[key].shape)}."
            )


def apply_norm(body: nn.Module, norm: str) -> nn.Module:
    """Apply ``model.backbone.norm`` to the BatchNorm layers of ``body`` (others are untouched)."""
    from timm.layers import convert_sync_batchnorm, freeze_batch_norm_2d

    if norm == "frozen_bn":
        return freeze_batch_norm_2d(body)
    if norm == "sync_bn":
        return convert_sync_batchnorm(body)
    return body


def frozen_parameter_names(cfg: BackboneConfig, layout: nn.Module, body: nn.Module, last_stage: int) -> set[str]:
    """Parameters of ``body`` that ``cfg.frozen_stages`` and ``cfg.train`` freeze."""
    import timm

    names = {name for name, _ in body.named_parameters()}
    strides = {entry["reduction"] for entry in layout.feature_info.info}
    stages = max((s for s in range(1, 9) if 2 ** (s + 1) in strides), default=last_stage)  # the model's, not built
    if cfg.frozen_stages > stages:
        raise ConfigError(f"model.backbone.frozen_stages={cfg.frozen_stages}: {cfg.name} has {stages} stages "
                          f"({stages} freezes them all, as model.backbone.train=false does).")  # fmt: skip
    if not cfg.train or cfg.frozen_stages >= last_stage:
        return names
    if cfg.frozen_stages <= 0:
        return set()
    (level,) = stage_levels(layout.feature_info, [cfg.frozen_stages], cfg.name, "model.backbone.frozen_stages")
    if level not in layout.feature_info.out_indices:
        with torch.device(next(layout.parameters()).device):
            layout = timm.create_model(cfg.name, features_only=True, pretrained=False, out_indices=(level,))
    try:
        return dependent_parameters(layout, level) & names
    except NotImplementedError:
        # Some operation has no meta-device kernel: probe a CPU copy instead (slower, same answer).
        cpu_layout = timm.create_model(cfg.name, features_only=True, pretrained=False, out_indices=(level,))
        return dependent_parameters(cpu_layout, level) & names


@BACKBONES.register("timm")
def build_timm_backbone(cfg: BackboneConfig, out_stages: list[int]) -> TimmBackbone:
    """Build a timm backbone from ``cfg``; ConfigError for bad ``out_stages``, ``dilation`` or an unknown name."""
    if not out_stages or sorted(set(out_stages)) != list(out_stages) or not set(out_stages) <= set(STAGES):
        raise ConfigError(f"model.backbone.out_stages must be ascending stage numbers in 1..4, got {out_stages}.")
    if cfg.dilation:
        raise ConfigError(
            "model.backbone.dilation is only supported with model.backbone.source=torchvision; "
            "set it to false for timm backbones."
        )
    try:
        import timm  # noqa: F401  (a dependency of detr_peg, missing or broken in this environment)
    except ImportError as exc:
        raise ConfigError(
            f"model.backbone.source=timm needs the timm package ({exc}): {install_hint('timm')}."
        ) from None
    check_timm_name(cfg.name)
    layout = layout_model(cfg.name)
    levels = stage_levels(layout.feature_info, out_stages, cfg.name, "model.backbone.out_stages")
    with contextlib.suppress(NotImplementedError):  # without a kernel on the meta device, the first batch tells
        probe_forward(layout, (PROBE_SIZE, PROBE_SIZE + 32))  # any size: not only the square it was made for
    body = create_body(cfg, levels, layout)
    body = apply_norm(body, cfg.norm)
    frozen = frozen_parameter_names(cfg, layout, body, max(out_stages))
    for name, param in body.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    info = body.feature_info
    backbone = TimmBackbone(
        body=body,
        out_channels=info.channels(),
        strides=info.reduction(),
        channels_last=getattr(body, "output_fmt", "NCHW") == "NHWC",
    )
    backbone.set_memory_format(MEMORY_FORMATS[cfg.memory_format])
    return backbone
