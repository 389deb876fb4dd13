"""A model rebuilt from a detr_peg checkpoint (stored config + whole state dict): :class:`LoadedModel`,
the form every command and :class:`detr_peg.Detector` hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from detr_peg.checkpoint.format import Checkpoint, load_weights, read_checkpoint
from detr_peg.config.loader import config_to_dict, load_config
from detr_peg.config.ranges import MAX_CLASSES
from detr_peg.config.schema import Config, ModelConfig
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import CheckpointError, ConfigError, DataError
from detr_peg.models.builder import TORCH_STATE, build_model, build_postprocessor, torch_defaults
from detr_peg.models.postprocess import Postprocessor


def without_backbone_weights(cfg: Config | ModelConfig) -> Config | ModelConfig:
    """``cfg`` (a config or its model section) with ``backbone.weights=None``, for models whose weights come
    from elsewhere."""
    if isinstance(cfg, Config):
        return replace(cfg, model=without_backbone_weights(cfg.model))
    return replace(cfg, backbone=replace(cfg.backbone, weights=None))


def resolve_num_classes(
    model: ModelConfig, label_map: LabelMap, source: str, *, categories: Sequence[Mapping[str, Any]] | None = None
) -> ModelConfig:
    """``model`` with ``num_classes`` taken from the label map when unset; ``categories`` (the file's list)
    lets messages name the entry. ConfigError when a set ``num_classes`` does not fit the map; DataError when
    the derived one is beyond the range of ``model.num_classes``.
    """
    if model.num_classes is None:
        if label_map.num_classes > MAX_CLASSES:
            raise DataError(
                f"Annotation file {source}: {_num_classes_origin(categories, label_map)} makes model.num_classes "
                f"{label_map.num_classes}, more than the {MAX_CLASSES} a model may have."
            )
        return replace(model, num_classes=label_map.num_classes)
    problem = label_map_fit_problem(label_map, model.num_classes)
    if problem:
        raise ConfigError(
            f"model.num_classes is {model.num_classes} but {source} {problem}; "
            "remove model.num_classes to take it from the data."
        )
    return model


def _num_classes_origin(categories: Sequence[Mapping[str, Any]] | None, label_map: LabelMap) -> str:
    """The field ``model.num_classes`` comes from: ``'categories' (3 entries)``, or the largest id when
    labels are the ids (``'categories[2].id' = 90 with data.contiguous_labels=false``)."""
    if categories is None:
        return f"{len(label_map)} categories"
    if label_map.contiguous or not categories:
        return f"'categories' ({len(categories)} entries)"
    index = max(range(len(categories)), key=lambda i: categories[i]["id"])
    return f"'categories[{index}].id' = {categories[index]['id']} with data.contiguous_labels=false"


def label_map_fit_problem(label_map: LabelMap, num_classes: int) -> str | None:
    """Why ``label_map`` does not fit a classifier of ``num_classes`` classes, or None when it does.

    A contiguous map must name exactly ``num_classes`` categories; a map of raw ids needs every id below
    ``num_classes`` (official COCO: ids 1..90, 91 classes).
    """
    if label_map.contiguous and len(label_map) != num_classes:
        return f"names {len(label_map)} categories with contiguous labels, which need exactly one class per category"
    if not label_map.contiguous and label_map.num_classes > num_classes:
        return f"has category id {label_map.category_ids[-1]}, and labels equal to the ids need {label_map.num_classes} classes"
    return None


def checkpoint_label_map(ckpt: Checkpoint, cfg: Config) -> LabelMap | None:
    """The label map stored in ``ckpt`` or None; CheckpointError if malformed or unfit for ``cfg``."""
    if not ckpt.label_map:
        return None
    try:
        label_map = LabelMap.from_dict(ckpt.label_map)
    except DataError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    problem = label_map_fit_problem(label_map, cfg.model.num_classes) if cfg.model.num_classes else None
    if problem:
        raise CheckpointError(
            f"{ckpt.path}: its model has {cfg.model.num_classes} classes (model.num_classes) but its label map "
            f"{problem}; the file was not written by one training run."
        )
    return label_map


@dataclass
class LoadedModel:
    """A detector with its config, post-processor and label map.

    Attributes:
        model: the bare detector (``nn.Module``), in eval mode once loaded.
        postprocessor: its architecture's :class:`~detr_peg.models.postprocess.Postprocessor`.
        config: the resolved :class:`Config` the model was built from.
        label_map: model label <-> dataset category, or None (labels reported as ``class <label>``).
        iteration: the training iteration of the checkpoint, if stored.
        source: the checkpoint file it was loaded from, if any.
    """

    model: nn.Module
    postprocessor: Postprocessor
    config: Config
    label_map: LabelMap | None = None
    iteration: int | None = None
    source: str | None = None

    @classmethod
    def from_config(cls, cfg: Config, *, label_map: LabelMap | None = None) -> LoadedModel:
        """A freshly built model of ``cfg`` (random init, or the backbone weights it names)."""
        with torch_defaults():
            return cls(build_model(cfg), build_postprocessor(cfg), cfg, label_map)

    def to(self, device: str | torch.device) -> LoadedModel:
        """Move the model to ``device`` (in place); returns self."""
        self.model.to(device)
        return self


def load_model(
    checkpoint: str | os.PathLike | Checkpoint,
    *,
    device: str | torch.device = "cpu",
    overrides: Iterable[str] = (),
    label_map: LabelMap | None = None,
    overrides_source: str = "overrides",
) -> LoadedModel:
    """Rebuild the model stored in a detr_peg checkpoint, in eval mode on ``device``.

    Args:
        checkpoint: ``.pth`` or ``.safetensors`` file, URL, or a
            :class:`~detr_peg.checkpoint.format.Checkpoint` already read.
        overrides: ``key=value`` config changes that do not alter weights (e.g. ``eval.num_select=50``).
        label_map: replaces the stored one (evaluation on other categories).
        overrides_source: how messages name where ``overrides`` came from.

    Raises:
        CheckpointError: unreadable or unsafe file, not a detr_peg checkpoint, or weights
            that do not fit the stored config.
        ConfigError: an override that is invalid or changes the model the weights were trained as.
    """
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    cfg = ckpt.config
    if overrides:
        cfg = load_config(
            None,
            overrides,
            base=config_to_dict(cfg),
            base_source=f"config stored in {ckpt.path}",
            overrides_source=overrides_source,
        )
    return model_from_checkpoint(ckpt, cfg, label_map=label_map).to(device)


#: ``model.*`` options a checkpoint may run under other values than it was trained with: how padded batches are
#: masked, the memory layout, and options that do nothing at inference.
FREE_MODEL_OPTIONS = {"mask_rule", "aux_loss", "backbone.memory_format", "backbone.weights", "backbone.train",
                      "backbone.frozen_stages", "transformer.dropout"}  # fmt: skip


def _leaves(section: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config section as ``{"dotted.key": value}``."""
    leaves: dict[str, Any] = {}
    for key, value in section.items():
        leaves.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value})
    return leaves


def model_from_checkpoint(ckpt: Checkpoint, cfg: Config, *, label_map: LabelMap | None = None) -> LoadedModel:
    """The model of ``cfg`` with the weights of ``ckpt``; raises CheckpointError when they do not fit, ConfigError
    when ``cfg`` changes what the weights compute (an option outside :data:`FREE_MODEL_OPTIONS`)."""
    trained, given = (_leaves(config_to_dict(c)["model"]) for c in (ckpt.config, cfg))
    for key in (k for k in given if k not in FREE_MODEL_OPTIONS and k in trained and given[k] != trained[k]):
        raise ConfigError(f"model.{key} cannot be {given[key]!r} for {ckpt.path}: its weights were trained with "
                          f"{trained[key]!r} (data.*, eval.*, model.mask_rule and model.backbone.memory_format "
                          "may change).")  # fmt: skip
    # The checkpoint holds the backbone weights; do not load them from elsewhere.
    cfg = without_backbone_weights(cfg)
    stored = checkpoint_label_map(ckpt, cfg)  # checked before the model is built
    with TORCH_STATE, torch.random.fork_rng(devices=[]), torch_defaults():  # the caller's generator stays
        model = build_model(cfg)
    load_weights(model, ckpt.model, f"Checkpoint {ckpt.path}")
    label_map = label_map if label_map is not None else stored
    iteration = ckpt.extra.get("iteration")
    source = os.path.abspath(ckpt.path) if os.path.isfile(ckpt.path) else str(ckpt.path)  # for a later os.chdir
    return LoadedModel(model.eval(), build_postprocessor(cfg), cfg, label_map, iteration, source)
