"""Converting official DETR-family checkpoints into detr_peg checkpoints.

The architecture is inferred from the weights wherever they determine it
(backbone depth, widths, layer counts, queries, classes); everything else
comes from, in increasing priority: ``--config FILE``, the ``args`` the
official training script stored in the checkpoint (if any), and ``key=value``
overrides. An override that contradicts the weights is an error. Converting
to another positional encoding (``model.position.name=peg``) keeps every
shared weight and initialises only what is new; the report lists exactly
which keys were new and which were unused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import detr_peg.convert.deformable  # noqa: F401  (registers the Deformable-DETR format)
import detr_peg.convert.detr  # noqa: F401  (registers the DETR format)
from detr_peg.checkpoint.format import save_checkpoint
from detr_peg.config.loader import Layer, build_config, dotted_layer, file_layers, parse_overrides
from detr_peg.config.schema import Config
from detr_peg.convert.registry import OFFICIAL_FORMATS, OfficialFormat
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.fileio.bounded_read import plain
from detr_peg.fileio.checkpoint_files import read_checkpoint_file
from detr_peg.models.builder import build_model
from detr_peg.models.loading import without_backbone_weights


@dataclass
class ConversionReport:
    """What a conversion did.

    Attributes:
        source_format: the official codebase ("DETR", "Deformable-DETR").
        config: the resolved config of the converted model.
        state_dict: the converted model state dict.
        new_keys: model keys the official weights did not provide (initialised fresh).
        unused_keys: official keys the model has no place for.
        aliases: official keys dropped as duplicates of a shared module.
        ignored_entries: top-level checkpoint entries other than the weights.
    """

    source_format: str
    config: Config
    state_dict: dict[str, Tensor]
    new_keys: list[str] = field(default_factory=list)
    unused_keys: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    ignored_entries: list[str] = field(default_factory=list)


def _load_official(src: str) -> tuple[dict[str, Tensor], dict[str, Any] | None, list[str]]:
    obj = read_checkpoint_file(src, what="official checkpoint")
    if isinstance(obj, dict) and "state_dict" in obj and "metadata" in obj:  # safetensors
        return obj["state_dict"], None, []
    if not isinstance(obj, dict):
        raise CheckpointError(f"{src} does not hold a checkpoint dict (found {type(obj).__name__}).")
    if obj.get("format") == "detr_peg":
        raise CheckpointError(f"{src} is already a detr_peg checkpoint; load it with detr_peg.load_model.")
    state = obj.get("model", obj)
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{src} has no 'model' state dict of tensors.")
    args = obj.get("args")
    if args is not None and not isinstance(args, dict):
        args = vars(args)
    ignored = sorted(k for k in obj if k != "model") if "model" in obj else []
    return state, args, ignored


def detect_format(state: dict[str, Tensor], src: str) -> OfficialFormat:
    """The registered official format whose layout ``state`` has."""
    found = [OFFICIAL_FORMATS.get(n) for n in OFFICIAL_FORMATS.names() if OFFICIAL_FORMATS.get(n).matches(state)]
    if len(found) == 1:
        return found[0]
    valid = ", ".join(OFFICIAL_FORMATS.get(n).name for n in OFFICIAL_FORMATS.names())
    raise CheckpointError(f"{src} is not a checkpoint of a known official codebase ({valid}).")


def _args_layer(args: dict[str, Any], fmt: OfficialFormat, source: str) -> Layer:
    values: dict[str, Any] = {}
    for name, target in fmt.args_map.items():
        if name not in args or args[name] is None:
            continue
        if callable(target):
            values.update(target(args[name]))
        else:
            values[target] = args[name]
    return dotted_layer(values, source)


def _refuse_contradictions(hard: dict[str, Any], cli: Layer, src: str) -> None:
    for key, value in hard.items():
        if key in cli and plain(cli[key][0]) != value:
            raise ConfigError(
                f"command line: {key}={plain(cli[key][0])!r} contradicts the weights in {src}, which have {value!r}; "
                "convert first, then change the model by fine-tuning (train.init_from with train.reset_classifier)."
            )


def resolve_config(
    state: dict[str, Tensor],
    args: dict[str, Any] | None,
    fmt: OfficialFormat,
    src: str,
    config_path: str | os.PathLike | None,
    overrides: Iterable[str],
) -> Config:
    """Merge config file, stored args and overrides around what the weights determine."""
    hard, soft = fmt.infer(state)
    cli = parse_overrides(overrides)
    _refuse_contradictions(hard, cli, src)
    layers: list[Layer] = []
    if config_path is not None:
        layers.extend(file_layers(config_path))
    # What the weights and their stored args say is kept where the chosen architecture and encoding have the field
    # (learned tables read from the weights are no error when converting to peg).
    read = len(layers)
    layers.append(dotted_layer(soft, f"weights in {src}"))
    if args:
        layers.append(_args_layer(args, fmt, f"args stored in {src}"))
    layers.append(dotted_layer(hard, f"weights in {src}"))
    layers.append(cli)
    cfg = build_config(layers, lenient=range(read, len(layers) - 1))
    if fmt.complete is not None:
        derived = fmt.complete(state, cfg)
        _refuse_contradictions(derived, cli, src)
        layers.insert(len(layers) - 1, dotted_layer(derived, f"weights in {src}"))
        cfg = build_config(layers, lenient=range(read, len(layers) - 1))
    # Weights travel inside the converted checkpoint; never load backbone weights again.
    return without_backbone_weights(cfg)


def map_state_dict(state: dict[str, Tensor], fmt: OfficialFormat, src: str) -> tuple[dict[str, Tensor], list[str]]:
    """Rename official keys; keys that map onto an already-mapped key must be identical aliases."""
    mapped: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    aliases: list[str] = []
    for key, value in state.items():
        if key.endswith("num_batches_tracked") and key.startswith("backbone."):
            continue
        target = fmt.key_map(key)
        if target is None:
            continue
        if target in mapped:
            if not torch.equal(mapped[target], value):
                raise CheckpointError(
                    f"{src}: '{key}' and '{origin[target]}' should be copies of one shared module but differ."
                )
            aliases.append(key)
            continue
        mapped[target] = value
        origin[target] = key
    return mapped, aliases


def convert_official(
    src: str | os.PathLike, *, config_path: str | os.PathLike | None = None, overrides: Iterable[str] = ()
) -> ConversionReport:
    """Convert an official checkpoint in memory.

    Args:
        src: official ``.pth`` (a dict with ``model`` and possibly ``args``,
            ``optimizer``, ...), a bare state dict, or ``.safetensors``.
        config_path: optional YAML config for what the weights do not determine.
        overrides: ``key=value`` config overrides.

    Returns:
        The report, including the converted state dict and config.
    """
    src = str(src)
    state, args, ignored = _load_official(src)
    fmt = detect_format(state, src)
    cfg = resolve_config(state, args, fmt, src, config_path, overrides)
    mapped, aliases = map_state_dict(state, fmt, src)
    model = build_model(cfg)
    own = model.state_dict()
    for key in own.keys() & mapped.keys():
        if own[key].shape != mapped[key].shape:
            raise CheckpointError(
                f"{src}: '{key}' has shape {tuple(mapped[key].shape)} but the configured model expects "
                f"{tuple(own[key].shape)}; check the config values the weights do not determine."
            )
    new_keys = sorted(k for k in own.keys() - mapped.keys() if not k.endswith("num_batches_tracked"))
    unused = sorted(mapped.keys() - own.keys())
    merged = {k: (mapped[k] if k in mapped else v) for k, v in own.items()}
    return ConversionReport(fmt.name, cfg, merged, new_keys, unused, aliases, ignored)


def convert_official_file(src: str | os.PathLike, dst: str | os.PathLike, **kwargs: Any) -> ConversionReport:
    """:func:`convert_official`, then write the detr_peg checkpoint ``dst`` atomically."""
    report = convert_official(src, **kwargs)
    save_checkpoint(
        dst,
        report.config,
        report.state_dict,
        label_map=None,
        converted_from={"format": report.source_format, "path": os.path.basename(str(src))},
    )
    return report
