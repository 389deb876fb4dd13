"""The detr_peg checkpoint: a ``weights_only``-loadable ``torch.save`` dict (``format``, ``format_version``, ``config``,
``model``, ``label_map``, plus training state from ``train``), or a ``.safetensors`` of the model tensors with
``format``, ``config`` and ``label_map`` (JSON) in its metadata. The model is rebuilt from the stored config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from detr_peg.bounded_read import parse_json
from detr_peg.checkpoint.files import atomic_torch_save, is_safetensors, read_checkpoint_file, unwrapped
from detr_peg.checkpoint.validation import check_checkpoint_fields
from detr_peg.checkpoint.weights_check import check_loaded_weights
from detr_peg.config.loader import config_differences, config_from_dict, config_to_dict
from detr_peg.config.ranges import is_whole
from detr_peg.config.schema import Config
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.outputs import atomic_write

FORMAT = "detr_peg"
FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    """A checkpoint read from disk: ``config``, ``model`` state dict, plain ``label_map``, ``extra`` training state."""

    path: str
    config: Config
    model: dict[str, Tensor]
    label_map: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dict(
    cfg: Config, model_state: dict[str, Tensor], label_map: dict | None = None, **extra: Any
) -> dict[str, Any]:
    """The dict that :func:`save_checkpoint` writes."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config_to_dict(cfg),
        "model": model_state,
        "label_map": label_map,
        **extra,
    }


def save_checkpoint(
    path: str | os.PathLike, cfg: Config, model_state: dict[str, Tensor], label_map: dict | None = None, **extra: Any
) -> None:
    """Write a checkpoint atomically (``.safetensors``: model only); ``CheckpointError`` leaves an old file intact."""
    path = Path(path)
    if is_safetensors(path):
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "config": json.dumps(config_to_dict(cfg)),
            "label_map": json.dumps(label_map),
        }
        tensors = {k: v.detach().contiguous().clone() for k, v in model_state.items()}
        # Serialised in memory (the model alone), then written like every checkpoint.
        data = safetensors_bytes(tensors, metadata=metadata)
        atomic_write(path, lambda handle: handle.write(data), error=CheckpointError)
        return
    atomic_torch_save(checkpoint_dict(cfg, model_state, label_map, **extra), path)


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and validate a detr_peg checkpoint (``.pth`` or ``.safetensors``).

    Raises ``CheckpointError`` if missing, corrupt, unsafe, of a newer format version, or not a detr_peg checkpoint
    (an official DETR/Deformable-DETR file is recognised and pointed to ``detr-peg convert``).
    """
    spec = os.fsdecode(path)
    obj = read_checkpoint_file(spec)
    if isinstance(obj, dict) and "metadata" in obj and "state_dict" in obj and is_safetensors(spec):
        meta = obj["metadata"]
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{spec} is a safetensors file without detr_peg metadata (format, config).")
        if "config" not in meta:
            raise CheckpointError(f"{spec}: the detr_peg metadata has no 'config'.")
        what = "The detr_peg metadata of"  # a JSON text inside the file: the same bounds as a config file
        check_format_version(meta.get("format_version"), spec, as_text=True)
        cfg_dict = parse_json(meta["config"].encode(), spec, what, "config", CheckpointError)
        label_map = parse_json(meta.get("label_map", "null").encode(), spec, what, "record", CheckpointError)
        check_checkpoint_fields({"model": obj["state_dict"], "label_map": label_map}, spec)
        return Checkpoint(spec, _config(cfg_dict, spec), unwrapped(obj["state_dict"]), label_map)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{spec} does not hold a checkpoint dict (found {type(obj).__name__}).")
    if obj.get("format") != FORMAT:
        if (
            "model" in obj
            and isinstance(obj["model"], dict)
            and any(k.startswith("backbone.0.body.") for k in obj["model"])
        ):
            raise CheckpointError(
                f"{spec} is an official DETR/Deformable-DETR checkpoint; convert it first with "
                f"`detr-peg convert {spec} OUT.pth`."
            )
        raise CheckpointError(f"{spec} is not a detr_peg checkpoint (no 'format': 'detr_peg' entry).")
    check_format_version(obj.get("format_version"), spec)
    for key in ("config", "model"):
        if not isinstance(obj.get(key), dict):
            raise CheckpointError(f"{spec} has no '{key}' entry.")
    check_checkpoint_fields(obj, spec)
    extra = {k: v for k, v in obj.items() if k not in ("format", "format_version", "config", "model", "label_map")}
    return Checkpoint(spec, _config(obj["config"], spec), unwrapped(obj["model"]), obj.get("label_map"), extra)


def check_format_version(version: Any, spec: str, *, as_text: bool = False) -> None:
    """Refuse a ``format_version`` other than 1 to :data:`FORMAT_VERSION` (``as_text``: safetensors metadata)."""
    number = int(version) if as_text and isinstance(version, str) and version.isdigit() else version
    if not is_whole(number) or not 1 <= number <= FORMAT_VERSION:
        raise CheckpointError(
            f"{spec} has format_version {version!r}; this detr_peg reads versions 1 to {FORMAT_VERSION}."
        )


def _config(data: dict, spec: str) -> Config:
    try:
        return config_from_dict(data, source=f"config stored in {spec}")
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def _apart(configs: tuple[Config, Config] | None) -> str:
    """``; the model settings differ: KEY A in the checkpoint, B here`` for ``configs`` (the checkpoint's, this one)."""
    if configs is None:
        return ""
    values = [config_to_dict(c) for c in configs]
    keys = config_differences(configs[1], configs[0], ("model",))
    shown = [f"{k} {_dotted(values[0], k)!r} in the checkpoint, {_dotted(values[1], k)!r} here" for k in keys[:3]]
    return f"; the model settings differ: {', '.join(shown)}" if shown else ""


def _dotted(data: dict, key: str) -> Any:
    for part in key.split("."):
        data = data.get(part, "unset") if isinstance(data, dict) else "unset"
    return data


def load_weights(
    model: nn.Module, state: dict[str, Tensor], source: str, configs: tuple[Config, Config] | None = None
) -> None:
    """``load_state_dict(strict=True)``; a one-sentence ``CheckpointError`` on missing, unexpected or reshaped keys,
    naming the model settings in which ``configs`` (the checkpoint's, this model's) differ."""
    own = model.state_dict()
    missing = sorted(k for k in own.keys() - state.keys() if not k.endswith("num_batches_tracked"))
    unexpected = sorted(state.keys() - own.keys())
    shapes = [
        (k, tuple(state[k].shape), tuple(own[k].shape))
        for k in own.keys() & state.keys()
        if state[k].shape != own[k].shape
    ]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit the model: {len(missing)} missing keys (first: {missing[:3]}) and "
            f"{len(unexpected)} unexpected keys (first: {unexpected[:3]}); it was made for another architecture"
            f"{_apart(configs)}."
        )
    if shapes:
        key, got, want = sorted(shapes)[0]
        raise CheckpointError(
            f"{source} does not fit the model: '{key}' has shape {got} but the model expects {want} "
            f"({len(shapes)} tensors differ){_apart(configs)}."
        )
    check_loaded_weights(state, own, source)
    model.load_state_dict(state, strict=False)
