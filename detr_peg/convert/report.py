"""What every conversion shares: config layers around the read values, key renaming, the fit to the model.

Config priority, lowest first: ``--config``, soft values, stored training args, hard values, overrides.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from detr_peg.bounded_read import plain
from detr_peg.checkpoint.format import save_checkpoint
from detr_peg.checkpoint.weights_check import check_loaded_weights
from detr_peg.config.loader import Layer, build_config, dotted_layer, file_layers, parse_overrides
from detr_peg.config.schema import Config
from detr_peg.convert.key_map import KeyMap
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.models.builder import build_model
from detr_peg.models.loading import without_backbone_weights


@dataclass
class ConversionReport:
    """What a conversion did: config, state dict, and the keys new (fresh init), unused, aliased or ignored."""

    source_format: str
    config: Config
    state_dict: dict[str, Tensor]
    new_keys: list[str] = field(default_factory=list)
    unused_keys: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    ignored_entries: list[str] = field(default_factory=list)
    label_map: dict | None = None


def refuse_contradictions(hard: dict[str, Any], cli: Layer, src: str) -> None:
    """Raise ``ConfigError`` for an override that changes a value the weights determine."""
    for key, value in hard.items():
        if key in cli and plain(cli[key][0]) != value:
            raise ConfigError(
                f"command line: {key}={plain(cli[key][0])!r} contradicts the weights in {src}, which have {value!r}; "
                "convert first, then change the model by fine-tuning (train.init_from with train.reset_classifier)."
            )


def resolve_layers(
    hard: dict[str, Any],
    soft: dict[str, Any],
    src: str,
    config_path: str | os.PathLike | None,
    overrides: Iterable[str],
    *,
    stored: Layer | None = None,
    complete: Callable[[Config], dict[str, Any]] | None = None,
) -> Config:
    """The converted config: ``--config``, soft, stored, hard (and ``complete``), overrides; backbone weights unset."""
    cli = parse_overrides(overrides)
    refuse_contradictions(hard, cli, src)
    layers: list[Layer] = []
    if config_path is not None:
        layers.extend(file_layers(config_path))
    # What the source says is kept where the chosen architecture and encoding have the field
    # (learned tables read from the weights are no error when converting to peg).
    read = len(layers)
    layers.append(dotted_layer(soft, f"weights in {src}"))
    if stored:
        layers.append(stored)
    layers.append(dotted_layer(hard, f"weights in {src}"))
    layers.append(cli)
    cfg = build_config(layers, lenient=range(read, len(layers) - 1))
    if complete is not None:
        derived = complete(cfg)
        refuse_contradictions(derived, cli, src)
        layers.insert(len(layers) - 1, dotted_layer(derived, f"weights in {src}"))
        cfg = build_config(layers, lenient=range(read, len(layers) - 1))
    return without_backbone_weights(cfg)


def map_state_dict(state: dict[str, Tensor], key_map: KeyMap, src: str) -> tuple[dict[str, Tensor], list[str]]:
    """Rename source keys, dropping ``num_batches_tracked``; ``CheckpointError`` when aliases of one key differ."""
    mapped: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    aliases: list[str] = []
    for key, value in state.items():
        if key.endswith("num_batches_tracked") and "backbone." in key:
            continue
        target = key_map(key)
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


def fit_to_model(cfg: Config, mapped: dict[str, Tensor], src: str) -> tuple[dict[str, Tensor], list[str], list[str]]:
    """``(state_dict, new_keys, unused_keys)`` of the model ``cfg`` builds, filled from ``mapped``.

    Raises ``CheckpointError`` for a tensor whose shape differs from the model's.
    """
    own = build_model(cfg).state_dict()
    for key in own.keys() & mapped.keys():
        if own[key].shape != mapped[key].shape:
            raise CheckpointError(
                f"{src}: '{key}' has shape {tuple(mapped[key].shape)} but the configured model expects "
                f"{tuple(own[key].shape)}; check the config values the weights do not determine."
            )
    check_loaded_weights(mapped, own, src)  # integer or non-finite weights are refused, never cast
    new_keys = sorted(k for k in own.keys() - mapped.keys() if not k.endswith("num_batches_tracked"))
    lacking = [k for k in new_keys if not k.startswith("transformer.position.")]  # only an encoding may be new
    if lacking:
        raise CheckpointError(
            f"{src} lacks {len(lacking)} trained weight(s) of the model, such as '{lacking[0]}'; a conversion "
            "initialises only a positional encoding the source has not (is the file cut short, or of another layout?)."
        )
    unused = sorted(mapped.keys() - own.keys())
    # Weights saved in half precision are stored in the model's float32, as loading them would.
    merged = {k: (mapped[k].to(v.dtype) if k in mapped else v) for k, v in own.items()}
    return merged, new_keys, unused


def save_report(report: ConversionReport, src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Write the converted checkpoint ``dst`` atomically, with its label map and where it came from."""
    save_checkpoint(
        dst,
        report.config,
        report.state_dict,
        label_map=report.label_map,
        converted_from={"format": report.source_format, "path": os.path.basename(os.path.normpath(os.fsdecode(src)))},
    )
