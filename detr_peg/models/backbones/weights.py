"""Loading backbone weights from a local file or a URL."""

from __future__ import annotations

from torch import Tensor, nn

from detr_peg.checkpoint.files import fetch_url, is_url, read_checkpoint_file, unwrapped
from detr_peg.errors import CheckpointError

#: The config key that chooses the backbone's weights (for every backbone source).
WEIGHTS_KEY = "model.backbone.weights"

# Keys under which common checkpoint layouts nest the state dict.
_NESTED_KEYS = ("state_dict", "model", "module")

# Key prefixes of detector checkpoints (official DETR, detr_peg) removed before loading into a backbone body.
STRIP_PREFIXES = ("backbone.0.body.", "backbone.body.")

# Key prefixes of the backbone body inside detector checkpoints (official DETR, detr_peg).
DETECTOR_PREFIXES = ("backbone.0.body.", "backbone.body.")


def download_error(what: str, exc: BaseException) -> CheckpointError:
    """The one-line CheckpointError for backbone weights that could not be downloaded, naming what to set instead."""
    lines = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return CheckpointError(
        f"Could not download {what} for {WEIGHTS_KEY} ({reason}); without network, set {WEIGHTS_KEY} to a "
        "local weights file (.pth or .safetensors, saved once where there is network) or to null for random "
        "initialisation."
    )


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


def read_backbone_state(spec: str) -> dict[str, Tensor]:
    """The tensor state dict in a ``.pth``/``.pt``/``.safetensors`` file or URL, unwrapped from ``state_dict`` etc.

    Raises CheckpointError for a missing, unreadable or unsafe file, a failed download, or no tensors.
    """
    if is_url(spec):
        try:
            fetch_url(spec)  # into torch's hub cache, where read_checkpoint_file finds it
        except CheckpointError as exc:
            # fetch_url raises `from None`: the network error itself is still its context.
            raise download_error(f"the backbone weights {spec}", exc.__context__ or exc) from None
    return unwrapped(extract_state_dict(read_checkpoint_file(spec, what="backbone weights"), spec))


def backbone_part(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Of a detector's state dict, only the backbone body's entries; any other state dict unchanged."""
    if any(key.startswith(DETECTOR_PREFIXES) for key in state):
        return {key: value for key, value in state.items() if key.startswith(DETECTOR_PREFIXES)}
    return state


def strip_key_prefixes(state: dict[str, Tensor], prefixes: tuple[str, ...]) -> dict[str, Tensor]:
    """``state`` with the first matching prefix of ``prefixes`` removed from each key."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        for prefix in prefixes:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        out[key] = value
    return out


def load_backbone_weights(
    body: nn.Module,
    spec: str,
    *,
    ignore_prefixes: tuple[str, ...] = (),
    strip_prefixes: tuple[str, ...] = STRIP_PREFIXES,
) -> None:
    """Load the weights in ``spec`` (file or URL) into a backbone body.

    ``ignore_prefixes``: keys to skip (e.g. an ImageNet classifier ``fc.``); ``strip_prefixes`` are
    removed first so detector checkpoints work too (their other weights are dropped).
    Raises CheckpointError for an unreadable file or keys/shapes that do not fit.
    """
    state = strip_key_prefixes(backbone_part(read_backbone_state(spec)), strip_prefixes)
    load_state_checked(body, state, spec, ignore_prefixes=ignore_prefixes)


def load_state_checked(
    body: nn.Module, state: dict[str, Tensor], source: str, *, ignore_prefixes: tuple[str, ...] = ()
) -> None:
    """Load ``state`` into ``body`` after checking keys and shapes fit exactly (``num_batches_tracked`` ignored).

    Raises CheckpointError for missing or unexpected keys or a differing shape.
    """
    cleaned = {
        key: value
        for key, value in state.items()
        if not key.startswith(ignore_prefixes) and not key.endswith("num_batches_tracked")
    }
    expected = {k for k in body.state_dict() if not k.endswith("num_batches_tracked")}
    missing = sorted(expected - cleaned.keys())
    unexpected = sorted(cleaned.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"Backbone weights {source} do not fit the backbone: "
            f"{len(missing)} missing keys (first: {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (first: {unexpected[:3]})."
        )
    own = body.state_dict()
    for key, value in cleaned.items():
        if own[key].shape != value.shape:
            raise CheckpointError(
                f"Backbone weights {source}: '{key}' has shape {tuple(value.shape)}, "
                f"the backbone expects {tuple(own[key].shape)}."
            )
    body.load_state_dict(cleaned, strict=False)
