"""Converting a Transformers checkpoint folder (or a Hugging Face Hub name) into a detr_peg checkpoint.

A Transformers folder holds ``config.json`` (architecture, sizes,
``id2label``) and the weights: ``model.safetensors``, the shards that
``model.safetensors.index.json`` lists, or ``pytorch_model.bin`` (read with
``weights_only=True``, never by unpickling objects). A Hub name
(``facebook/detr-resnet-50``) is fetched with ``huggingface_hub`` first
(:mod:`detr_peg.fileio.hub_files`); offline, a name already in the Hugging
Face cache is read from there, and any other is refused with a message that
says to pass a local folder.

The ``model_type`` of ``config.json`` picks the format
(:data:`~detr_peg.convert.registry.TRANSFORMERS_FORMATS`): ``detr``
(:mod:`~detr_peg.convert.transformers_detr`) or ``deformable_detr``
(:mod:`~detr_peg.convert.transformers_deformable`). The config is derived
from ``config.json`` and the weights, with ``--config`` and ``key=value``
overrides as for official checkpoints (:mod:`~detr_peg.convert.report`);
the label map comes from ``id2label``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from torch import Tensor

import detr_peg.convert.transformers_deformable  # noqa: F401  (registers the Deformable-DETR format)
import detr_peg.convert.transformers_detr  # noqa: F401  (registers the DETR format)
from detr_peg.convert.registry import TRANSFORMERS_FORMATS, TransformersFormat
from detr_peg.convert.report import ConversionReport, fit_to_model, map_state_dict, resolve_layers, save_report
from detr_peg.convert.transformers_config import label_map_of, read_config_json, refusal
from detr_peg.convert.transformers_keys import fuse_attention_projections
from detr_peg.errors import CheckpointError
from detr_peg.fileio.checkpoint_files import read_checkpoint_file
from detr_peg.fileio.hub_files import ModelFolder, model_folder
from detr_peg.models.loading import label_map_fit_problem

CONFIG_JSON = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"


def transformers_format(config: dict[str, Any], src: str) -> TransformersFormat:
    """The registered format of a ``config.json``, checked against its ``architectures``.

    Raises:
        CheckpointError: a ``model_type`` or model class detr_peg does not convert.
    """
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
    """The state dict of a Transformers folder (safetensors, sharded safetensors or ``pytorch_model.bin``).

    Raises:
        CheckpointError: no weights file, or an unreadable or unsafe one.
    """
    path = folder.file(SAFETENSORS, **download)
    if path is not None:
        return read_checkpoint_file(path, what="Transformers weights")["state_dict"]
    index = folder.file(SAFETENSORS_INDEX, **download)
    if index is not None:
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{folder.spec}: {SAFETENSORS_INDEX} has no readable weight_map ({exc}).") from None
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(read_weights_file(folder.first_file([shard], "listed shard", **download), folder.spec))
        return state
    path = folder.first_file([PYTORCH_BIN], f"weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or)", **download)
    return read_weights_file(path, folder.spec)


def read_weights_file(path: os.PathLike, src: str) -> dict[str, Tensor]:
    """The tensors of one ``.safetensors`` or ``.bin`` weights file.

    Raises:
        CheckpointError: the file holds something other than a dict of tensors.
    """
    obj = read_checkpoint_file(path, what="Transformers weights")
    state = obj["state_dict"] if str(path).endswith(".safetensors") else obj
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
    """Convert a Transformers DETR or Deformable-DETR checkpoint in memory.

    Args:
        src: a local folder, or a Hub name (``owner/name`` or ``owner/name@revision``).
        config_path: optional config file for what ``config.json`` does not determine.
        overrides: ``key=value`` config overrides (``model.position.name=peg``
            keeps every shared weight and starts the PEG fresh).
        download: arguments of :func:`huggingface_hub.hf_hub_download` for a
            Hub name (``cache_dir``, ``token``, ``local_files_only``, ...).

    Returns:
        The report, with the converted state dict, config and label map.

    Raises:
        CheckpointError: an unreadable folder, the Hub unreachable (offline),
            or a setting detr_peg cannot represent (one sentence naming the field).
    """
    src = str(src)
    folder = model_folder(src)
    config = read_config_json(folder.first_file([CONFIG_JSON], CONFIG_JSON, **download), src)
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


def convert_transformers_file(src: str | os.PathLike, dst: str | os.PathLike, **kwargs: Any) -> ConversionReport:
    """:func:`convert_transformers`, then write the detr_peg checkpoint ``dst`` atomically."""
    report = convert_transformers(src, **kwargs)
    save_report(report, src, dst)
    return report
