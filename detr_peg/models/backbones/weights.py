"""Loading backbone weights from a local file or a URL."""

from __future__ import annotations

from torch import Tensor, nn

from detr_peg.checkpoint.io import read_checkpoint_file
from detr_peg.errors import CheckpointError

# Keys under which common checkpoint layouts nest the state dict.
_NESTED_KEYS = ("state_dict", "model", "module")


def extract_state_dict(obj: object, source: str) -> dict[str, Tensor]:
    """Find the tensor state dict inside a loaded checkpoint object."""
    if isinstance(obj, dict):
        for key in _NESTED_KEYS:
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, Tensor) for v in inner.values()):
                return inner
        if obj and all(isinstance(v, Tensor) for v in obj.values()):
            return obj
    raise CheckpointError(f"{source} holds no state dict of tensors (looked at the top level and {_NESTED_KEYS}).")


def load_backbone_weights(
    body: nn.Module,
    spec: str,
    *,
    ignore_prefixes: tuple[str, ...] = (),
    strip_prefixes: tuple[str, ...] = ("backbone.0.body.", "backbone.body.", "module."),
) -> None:
    """Load a state dict into a backbone body.

    Args:
        body: the module to load into.
        spec: local ``.pth``/``.pt``/``.safetensors`` file or ``http(s)://`` URL.
        ignore_prefixes: keys of the file to skip (for example the classifier
            ``fc.`` of an ImageNet checkpoint, or stages that were not built).
        strip_prefixes: prefixes removed from keys first, so detector
            checkpoints work as backbone weights too.

    Raises:
        CheckpointError: unreadable file, or keys/shapes that do not fit.
    """
    state = extract_state_dict(read_checkpoint_file(spec, what="backbone weights"), spec)
    cleaned: dict[str, Tensor] = {}
    for key, value in state.items():
        for prefix in strip_prefixes:
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        if key.startswith(ignore_prefixes) or key.endswith("num_batches_tracked"):
            continue
        cleaned[key] = value
    expected = {k for k in body.state_dict() if not k.endswith("num_batches_tracked")}
    missing = sorted(expected - cleaned.keys())
    unexpected = sorted(cleaned.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"Backbone weights {spec} do not fit the backbone: "
            f"{len(missing)} missing keys (first: {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (first: {unexpected[:3]})."
        )
    own = body.state_dict()
    for key, value in cleaned.items():
        if own[key].shape != value.shape:
            raise CheckpointError(
                f"Backbone weights {spec}: '{key}' has shape {tuple(value.shape)}, "
                f"the backbone expects {tuple(own[key].shape)}."
            )
    body.load_state_dict(cleaned, strict=False)
