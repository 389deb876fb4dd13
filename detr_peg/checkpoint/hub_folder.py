"""A detr_peg model as a Hugging Face Hub folder, no pickle: ``config.json`` (``format``, ``format_version``,
``library_name``, ``config``, ``label_map``), ``model.safetensors`` (a complete detr_peg checkpoint by itself;
the one loaded) and ``README.md`` (the model card). ``config.json`` must match the weights' metadata.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData
from torch import Tensor

from detr_peg.checkpoint.format import (
    FORMAT,
    FORMAT_VERSION,
    Checkpoint,
    check_format_version,
    read_checkpoint,
    save_checkpoint,
)
from detr_peg.config.loader import config_to_dict
from detr_peg.config.schema import Config
from detr_peg.errors import CheckpointError
from detr_peg.messages import one_line
from detr_peg.outputs import atomic_write_text

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
LIBRARY = "detr_peg"
REPOSITORY = "https://github.com/detr-peg/detr_peg"
DOCUMENTATION = "https://detr-peg.github.io/detr_peg/huggingface/"
#: The COCO numbers of a model card's table, in this order.
METRIC_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100")
ARCHITECTURES = {"detr": "DETR", "deformable_detr": "Deformable-DETR"}


def folder_config(cfg: Config, label_map: dict | None) -> dict[str, Any]:
    """The content of a detr_peg folder's ``config.json``."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library_name": LIBRARY,
        "config": config_to_dict(cfg),
        "label_map": label_map,
    }


def is_detr_peg_config(data: Mapping[str, Any]) -> bool:
    """Whether a parsed ``config.json`` is a detr_peg folder's (rather than a Transformers model's)."""
    return data.get("format") == FORMAT


def write_hub_folder(folder: str | os.PathLike, cfg: Config, state: dict[str, Tensor], label_map: dict | None) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` atomically; ``CheckpointError`` if it cannot."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint(folder / WEIGHTS, cfg, state, label_map)
    text = json.dumps(folder_config(cfg, label_map), indent=2) + "\n"
    atomic_write_text(folder / CONFIG_JSON, text, error=CheckpointError)


def read_hub_folder(weights: Path, config: Mapping[str, Any] | None, spec: str) -> Checkpoint:
    """The checkpoint of a detr_peg folder: its ``weights`` file, checked against its parsed ``config.json``.

    Raises ``CheckpointError`` for a folder that is not detr_peg's, unreadable weights, or a differing config.
    """
    if config is None or not is_detr_peg_config(config):
        raise CheckpointError(f"{spec} is not a detr_peg model folder (its {CONFIG_JSON} has no 'format': 'detr_peg').")
    check_format_version(config.get("format_version"), f"{spec}: {CONFIG_JSON}")
    checkpoint = read_checkpoint(weights)
    if config.get("config") != json.loads(json.dumps(config_to_dict(checkpoint.config))):
        raise CheckpointError(
            f"{spec}: the config in {CONFIG_JSON} differs from the one stored with {WEIGHTS}; "
            "write the folder again with Detector.save_pretrained."
        )
    return Checkpoint(spec, checkpoint.config, checkpoint.model, checkpoint.label_map, checkpoint.extra)


def model_card(cfg: Config, label_map: dict | None, metrics: Mapping[str, float] | None, name: str) -> ModelCard:
    """The model card of a detr_peg folder; ``metrics`` in COCO percent, ``name`` as ``from_pretrained`` takes it."""
    m = cfg.model
    arch = ARCHITECTURES.get(m.arch, m.arch)
    variant = [v for v, on in (("box refinement", "with_box_refine"), ("two-stage", "two_stage")) if getattr(m, on, 0)]
    data = ModelCardData(
        library_name=LIBRARY,
        pipeline_tag="object-detection",
        tags=sorted({"object-detection", LIBRARY, m.arch.replace("_", "-"), f"position-{m.position.name}"}),
    )
    lines = [
        f"# {arch}{' (' + ', '.join(variant) + ')' if variant else ''}, {m.position.name} positional encoding",
        "",
        f"A [{LIBRARY}]({REPOSITORY}) detector: {arch} with a {m.backbone.name} backbone "
        f"({m.backbone.source}), the `{m.position.name}` positional encoding, {m.transformer.enc_layers} encoder and "
        f"{m.transformer.dec_layers} decoder layers of width {m.transformer.hidden_dim}, and {m.num_classes} classes.",
        "",
        "## Use",
        "",
        "```python",
        "import detr_peg",
        "",
        f"detector = detr_peg.Detector.from_pretrained({json.dumps(name)})",  # a valid literal for any name
        'detections = detector.predict("photo.jpg")  # boxes in pixels (x0, y0, x1, y1), scores, class names',
        "```",
        "",
        f"See the [documentation]({DOCUMENTATION}) for the folder's files and how it was made.",
        "",
        "## Metrics",
        "",
        *_metrics_table(metrics),
        "",
        "## Classes",
        "",
        _classes(label_map, m.num_classes),
        "",
        "## Training config",
        "",
        "```yaml",
        yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip(),
        "```",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def _metrics_table(metrics: Mapping[str, float] | None) -> list[str]:
    if not metrics:
        return ["No evaluation metrics were given."]
    rows = [f"| {name} | {metrics[name]:.1f} |" for name in METRIC_NAMES if name in metrics and metrics[name] >= 0]
    return ["COCO bbox metrics, percent.", "", "| metric | value |", "|---|---|", *rows]


def _markdown(text: str) -> str:
    """``text`` shown as itself in Markdown: no HTML, emphasis, links, tables or line breaks of its own."""
    return re.sub(r"([\\`*_\[\]#|~])", r"\\\1", html.escape(one_line(text), quote=False))


def _classes(label_map: dict | None, num_classes: int) -> str:
    if not label_map:
        return f"{num_classes} classes without names (labels 0 to {num_classes - 1})."
    pairs = [f"{cid}: {_markdown(name)}" for cid, name in zip(label_map["category_ids"], label_map["names"])]
    kind = "label = category id" if not label_map["contiguous"] else "labels 0, 1, ... in category id order"
    return f"{len(pairs)} categories ({kind}): " + ", ".join(pairs) + "."
