"""Converting a Transformers checkpoint folder or Hub name into a detr_peg checkpoint.

Weights are read from safetensors (sharded or not) or ``pytorch_model.bin`` with ``weights_only=True``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from torch import Tensor

import detr_peg.convert.transformers_deformable  # noqa: F401  (registers the Deformable-DETR format)
import detr_peg.convert.transformers_detr  # noqa: F401  (registers the DETR format)
from detr_peg.bounded_read import parse_json, read_bounded_bytes
from detr_peg.checkpoint.files import is_safetensors, read_checkpoint_file
from detr_peg.checkpoint.format import FORMAT
from detr_peg.checkpoint.hub_files import ModelFolder, model_folder
from detr_peg.convert.registry import TRANSFORMERS_FORMATS, TransformersFormat
from detr_peg.convert.report import ConversionReport, fit_to_model, map_state_dict, resolve_layers
from detr_peg.convert.source_kind import NO_CONVERSION
from detr_peg.convert.transformers_config import label_map_of, read_config_json, refusal
from detr_peg.convert.transformers_keys import fuse_attention_projections
from detr_peg.data.coco_file import file_name_problem
from detr_peg.errors import CheckpointError
from detr_peg.models.loading import label_map_fit_problem

CONFIG_JSON = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"


def transformers_format(config: dict[str, Any], src: str) -> TransformersFormat:
    """The registered format of a ``config.json``; ``CheckpointError`` for a model type or class not converted."""
    model_type = config.get("model_type")
    if model_type not in TRANSFORMERS_FORMATS:
        valid = ", ".join(TRANSFORMERS_FORMATS.names())
        raise refusal(src, "model_type", model_type, f"is none of the model types detr_peg converts ({valid})")
    fmt = TRANSFORMERS_FORMATS.get(model_type)
    architectures = config.get("architectures") or [fmt.architecture]
    if fmt.architecture not in architectures:
        raise refusal(
            src, "architectures", architectures, f"does not list {fmt.architecture}, the detector detr_peg converts"
        )
    return fmt


def read_weights(folder: ModelFolder, **download: Any) -> dict[str, Tensor]:
    """The state dict of a Transformers folder; ``CheckpointError`` if missing, unreadable or unsafe."""
    path = folder.file(SAFETENSORS, **download)
    if path is not None:
        return read_checkpoint_file(path, what="Transformers weights")["state_dict"]
    index = folder.file(SAFETENSORS_INDEX, **download)
    if index is not None:
        raw = read_bounded_bytes(index, "Weights index", "record", CheckpointError)
        data = parse_json(raw, index, "Weights index", "record", CheckpointError)
        try:
            shards = sorted(set(data["weight_map"].values()))
        except (KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{folder.spec}: {SAFETENSORS_INDEX} has no readable weight_map ({exc}).") from None
        for shard in shards:
            problem = file_name_problem(shard, "the model folder")
            if problem is not None:
                raise CheckpointError(f"{folder.spec}: {SAFETENSORS_INDEX} names the shard {shard!r}, {problem}.")
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(read_weights_file(folder.first_file([shard], "listed shard", **download), folder.spec))
        return state
    path = folder.first_file([PYTORCH_BIN], f"weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or)", **download)
    return read_weights_file(path, folder.spec)


def read_weights_file(path: os.PathLike, src: str) -> dict[str, Tensor]:
    """The tensors of one weights file; ``CheckpointError`` if it is not a dict of tensors."""
    obj = read_checkpoint_file(path, what="Transformers weights")
    state = obj["state_dict"] if is_safetensors(path) else obj
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{src}: {os.path.basename(path)} does not hold a state dict of tensors.")
    return state


def convert_transformers(
    src: str | os.PathLike,
    *,
    config_path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    **download: Any,
) -> ConversionReport:
    """Convert a Transformers folder or Hub name (``owner/name[@revision]``) in memory; the report.

    ``download``: ``hf_hub_download`` arguments. Raises ``CheckpointError``: unreadable folder, Hub
    unreachable, or an unrepresentable setting.
    """
    src = os.fsdecode(src)
    folder = model_folder(src)
    config = read_config_json(folder.first_file([CONFIG_JSON], CONFIG_JSON, **download), src)
    if config.get("format") == FORMAT:
        raise CheckpointError(
            NO_CONVERSION.format(src=src)
            + f"{src}/model.safetensors to eval or predict as --checkpoint, or {src} to Detector.from_pretrained."
        )
    fmt = transformers_format(config, src)
    label_map = label_map_of(config, src)
    state = read_weights(folder, **download)
    hard, soft = fmt.read(config, state, src)
    cfg = resolve_layers(hard, soft, src, config_path, overrides)
    problem = label_map_fit_problem(label_map, cfg.model.num_classes)
    if problem:
        raise CheckpointError(f"{src}: the model has {cfg.model.num_classes} classes but id2label {problem}.")
    mapped, aliases = map_state_dict(fuse_attention_projections(state, src), fmt.key_map, src)
    if fmt.fill is not None:
        fmt.fill(mapped, cfg)
    merged, new_keys, unused = fit_to_model(cfg, mapped, src)
    return ConversionReport(fmt.name, cfg, merged, new_keys, unused, aliases, label_map=label_map.to_dict())
