"""Hugging Face Hub folders for :class:`detr_peg.Detector`: ``save_pretrained``, ``from_pretrained``, ``push_to_hub``.

A folder is ``config.json``, ``model.safetensors`` and a model card ``README.md`` (no pickle);
Transformers DETR / Deformable-DETR folders are converted on loading.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelHubMixin

from detr_peg.checkpoint.format import Checkpoint
from detr_peg.checkpoint.hub_files import hub_errors, model_folder
from detr_peg.checkpoint.hub_folder import (
    CONFIG_JSON,
    DOCUMENTATION,
    LIBRARY,
    REPOSITORY,
    WEIGHTS,
    is_detr_peg_config,
    model_card,
    read_hub_folder,
    write_hub_folder,
)
from detr_peg.config.ranges import is_number
from detr_peg.convert.transformers_config import read_config_json
from detr_peg.convert.transformers_folder import convert_transformers
from detr_peg.engine.evaluation.metric_units import read_metrics
from detr_peg.engine.evaluation.run import METRICS_JSON
from detr_peg.errors import CheckpointError, ConfigError, UserError
from detr_peg.models.loading import LoadedModel, model_from_checkpoint
from detr_peg.outputs import HOLDER_FILE, LOCK_FILE, OWNERSHIP_FILE, Output, guard_outputs, writing

#: The arguments of ``huggingface_hub.hf_hub_download`` that ``from_pretrained`` passes on.
DOWNLOAD_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "token")


def load_pretrained(spec: str, **download: Any) -> LoadedModel:
    """The model of the folder or Hub name ``spec`` (``owner/name[@revision]``), in eval mode on the CPU.

    A ``config.json`` without ``"format": "detr_peg"`` is read as a Transformers folder and converted.
    Raises ``CheckpointError``: no such folder, Hub unreachable and not cached, an unrepresentable
    Transformers setting, or weights that do not fit their config.
    """
    folder = model_folder(spec)
    config = read_config_json(folder.first_file([CONFIG_JSON], CONFIG_JSON, **download), spec)
    if is_detr_peg_config(config):
        weights = folder.first_file([WEIGHTS], WEIGHTS, **download)
        checkpoint = read_hub_folder(weights, config, spec)  # its weights file is the source: it can start a run
        return dataclasses.replace(
            model_from_checkpoint(checkpoint, checkpoint.config), source=os.path.abspath(weights)
        )
    report = convert_transformers(spec, **download)
    checkpoint = Checkpoint(spec, report.config, report.state_dict, report.label_map)
    return model_from_checkpoint(checkpoint, checkpoint.config)


class HubFolders(
    ModelHubMixin, library_name=LIBRARY, pipeline_tag="object-detection", repo_url=REPOSITORY, docs_url=DOCUMENTATION
):
    """``save_pretrained``, ``from_pretrained`` and ``push_to_hub`` of a class built as ``cls(loaded, device=...)``."""

    loaded: LoadedModel

    def __new__(cls, *args: Any, **kwargs: Any) -> HubFolders:
        # ModelHubMixin.__new__ records the constructor's arguments as the folder's config, turning a dataclass
        # argument into a dict with dataclasses.asdict: a deep copy of the LoadedModel, model included. The
        # folder's config.json is written by _save_pretrained instead, so nothing is recorded.
        return object.__new__(cls)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        device: str | torch.device = "auto",
        revision: str | None = None,
        **download: Any,
    ) -> Any:
        """The model of a local folder or a Hugging Face Hub name (``owner/name``).

        A Transformers ``DetrForObjectDetection`` / ``DeformableDetrForObjectDetection`` folder is converted
        as ``detr-peg convert`` does. ``revision``: branch, tag or commit; ``download``: further
        ``huggingface_hub`` download arguments (``cache_dir``, ``token``, ``local_files_only``, ...).
        Raises ``CheckpointError``: no such folder, Hub unreachable and not cached, unfitting weights.
        """
        spec = os.fsdecode(pretrained_model_name_or_path)
        model_folder(spec)  # a folder or a Hub name, else one sentence before the Hub is asked
        with hub_errors(spec):  # not ModelHubMixin's, which parses config.json unbounded before _from_pretrained
            return cls._from_pretrained(model_id=spec, revision=revision, device=device, **download)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None, device: Any = "auto", **download: Any) -> Any:
        spec = f"{model_id}@{revision}" if revision else model_id
        loaded = load_pretrained(spec, **{k: v for k, v in download.items() if k in DOWNLOAD_ARGUMENTS})
        return cls(loaded, device=device)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> str | None:
        """Write ``config.json``, ``model.safetensors`` and ``README.md`` (unless present) into ``save_directory``.

        ``metrics`` (COCO, percent) go into the model card; default: the ``metrics.json`` next to the source
        checkpoint. ``kwargs``: ``push_to_hub=True, repo_id=...`` etc. Returns the commit URL when pushed,
        else None. Under the commands' output rules: ``UserError`` for a ``config.json`` or ``model.safetensors``
        not written by ``save_pretrained``, or a folder another process writes; ``ConfigError`` for an ONNX graph.
        """
        numbers = isinstance(metrics, dict) and all(isinstance(k, str) and is_number(v) for k, v in metrics.items())
        if metrics is not None and not numbers:
            raise ConfigError(f"metrics must be a dict of metric names to finite numbers (percent), got {metrics!r}.")
        card = dict(kwargs.pop("model_card_kwargs", None) or {})
        card.setdefault("metrics", metrics)
        if card["metrics"] is None and self.loaded.source and Path(self.loaded.source).is_file():
            card["metrics"] = run_metrics(Path(self.loaded.source).parent / METRICS_JSON)  # refused before a write
        output = Output(save_directory, "save_directory", (CONFIG_JSON, WEIGHTS, "README.md"))  # TypeError if no path
        card.setdefault("name", kwargs.get("repo_id") or os.fsdecode(save_directory))
        if os.path.isfile(output.targets()[-1]):  # README.md is claimed unless a file is there
            output = dataclasses.replace(output, names=(CONFIG_JSON, WEIGHTS))
        with guard_outputs("save", [], [output]), writing(save_directory):  # the model card's OSError too
            return super().save_pretrained(save_directory, model_card_kwargs=card, **kwargs)

    def push_to_hub(self, repo_id: str, *, model_card_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> str:
        """Save the folder and upload it to the Hub repository ``repo_id``; the commit URL.

        ``model_card_kwargs={"metrics": {...}}`` sets the model card's metrics.
        """
        card = {"name": repo_id, **(model_card_kwargs or {})}
        ignore = kwargs.pop("ignore_patterns", None) or []
        ignore = [ignore] if isinstance(ignore, str) else list(ignore)
        ignore += [LOCK_FILE, HOLDER_FILE, OWNERSHIP_FILE]  # the output rules' own files stay here
        try:
            return super().push_to_hub(repo_id, model_card_kwargs=card, ignore_patterns=ignore, **kwargs)
        except UserError:
            raise
        except Exception as exc:  # network and Hub errors come in many types (httpx, huggingface_hub, OSError)
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise CheckpointError(
                f"Could not push to {repo_id} on the Hugging Face Hub ({reason}); check the network, the name and "
                "`hf auth login`."
            ) from exc

    def _checked(self) -> LoadedModel:  # the Detector's: the model checked as it is now
        return self.loaded

    def _save_pretrained(self, save_directory: Path) -> None:
        if not isinstance(self.loaded.model, torch.nn.Module):
            raise ConfigError("save_pretrained needs a PyTorch model; load the checkpoint, not the ONNX graph.")
        loaded = self._checked()
        label_map = loaded.label_map.to_dict() if loaded.label_map is not None else None
        write_hub_folder(save_directory, loaded.config, loaded.model.state_dict(), label_map)

    def generate_model_card(self, *args: Any, metrics: dict | None = None, name: str = "", **kwargs: Any) -> ModelCard:
        """The folder's ``README.md`` (:func:`~detr_peg.checkpoint.hub_folder.model_card`)."""
        label_map = self.loaded.label_map.to_dict() if self.loaded.label_map is not None else None
        return model_card(self.loaded.config, label_map, metrics, name or "owner/name")


def run_metrics(path: Path) -> dict[str, float] | None:
    """The COCO metrics of a run's ``metrics.json`` (percent), or None; ``CheckpointError`` if it is not one."""
    if not path.is_file():
        return None
    try:
        return read_metrics(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{path} cannot be read as the run's metrics ({exc}); pass metrics=... instead."
        ) from None
