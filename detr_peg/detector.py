"""The object a user holds: :class:`Detector`, a trained model that turns images into boxes.

::

    import detr_peg

    detector = detr_peg.Detector.from_checkpoint("runs/peg/checkpoint.pth")
    detections = detector.predict("photo.jpg", threshold=0.5)
    print(detections.class_names, detections.boxes)          # boxes: x0, y0, x1, y1 pixels

``predict`` takes one image or a list of images (paths, PIL images, NumPy
``(H, W, 3)`` uint8 arrays, ``(3, H, W)`` tensors) and returns one
:class:`~detr_peg.engine.detections.Detections` per image. Images are resized
by the evaluation transform of the model's config, then batched by equal
size, each batch padded only to a multiple of the model's coarsest stride:
a batch gives exactly what one image at a time gives (up to float rounding),
whatever the sizes in the list. ``evaluate`` gives the COCO metrics of a
COCO-format set and ``export_onnx`` writes an ONNX graph.

The command line's ``predict`` and ``demo`` are thin wrappers over this class;
``detr-peg eval`` runs the same inference loop
(:func:`~detr_peg.engine.inference.run_inference`) sharded over processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from detr_peg.config.loader import config_to_dict, load_config
from detr_peg.config.schema import Config
from detr_peg.data.coco_dataset import build_coco_dataset
from detr_peg.data.image_input import ImageInput, as_rgb_tensor
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.engine.detections import Detections, category_of
from detr_peg.engine.distributed import DistEnv, resolve_device
from detr_peg.engine.evaluation.evaluate import evaluate
from detr_peg.engine.inference import run_inference
from detr_peg.engine.loader import build_eval_loader
from detr_peg.engine.mixed_precision import evaluation_amp
from detr_peg.errors import ConfigError
from detr_peg.models.loading import LoadedModel, load_model


class Detector:
    """A detector ready for inference: model, post-processor, label map, device and precision.

    Build one with :meth:`from_checkpoint`, :meth:`from_config` or
    :meth:`from_onnx`, or from a :class:`~detr_peg.models.loading.LoadedModel`.

    Args:
        loaded: the model with its config, post-processor and label map.
        device: ``auto`` (a GPU when there is one), ``cpu``, ``cuda`` or ``cuda:N``.

    Attributes:
        loaded: the :class:`~detr_peg.models.loading.LoadedModel`.
        device: the ``torch.device`` the model runs on.
        amp: the autocast of the forward pass (``train.amp`` of the config where
            the device supports it natively, else ``none``).
    """

    def __init__(self, loaded: LoadedModel, *, device: str | torch.device = "auto") -> None:
        self.loaded = loaded
        self.device = device if isinstance(device, torch.device) else resolve_device(str(device))
        if isinstance(loaded.model, torch.nn.Module):
            loaded.to(self.device).model.eval()
        else:  # an ONNX Runtime graph runs on the CPU
            self.device = torch.device("cpu")
        self.amp = evaluation_amp(loaded.config.train.amp, self.device)
        self._transform = build_eval_transforms(loaded.config.data)

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, *, device: str | torch.device = "auto", overrides: Iterable[str] = ()
    ) -> Detector:
        """The model of a detr_peg checkpoint (``.pth`` or ``.safetensors`` file, or URL).

        Args:
            path: the checkpoint.
            device: see the class.
            overrides: ``key=value`` config changes that do not alter weights
                (``data.val_scale=512``, ``eval.score_threshold=0.3``).

        Raises:
            CheckpointError: unreadable, unsafe or unfitting checkpoint.
        """
        return cls(load_model(path, overrides=overrides), device=device)

    @classmethod
    def from_config(
        cls,
        config: str | os.PathLike | Config,
        overrides: Iterable[str] = (),
        *,
        label_map: LabelMap | None = None,
        device: str | torch.device = "auto",
    ) -> Detector:
        """A freshly built model (random weights, or the backbone weights the config names).

        Args:
            config: a YAML config file or a :class:`Config`; ``model.num_classes``
                must be set (or given in ``overrides``).
            overrides: ``key=value`` changes.
            label_map: class names for the labels, if known.
            device: see the class.
        """
        if isinstance(config, Config):
            cfg = load_config(None, list(overrides), base=config_to_dict(config)) if overrides else config
        else:
            cfg = load_config(config, list(overrides))
        return cls(LoadedModel.from_config(cfg, label_map=label_map), device=device)

    @classmethod
    def from_onnx(cls, path: str | os.PathLike, *, overrides: Iterable[str] = ()) -> Detector:
        """A graph written by :meth:`export_onnx` (or ``detr-peg export``), run in ONNX Runtime on the CPU.

        Raises:
            UserError: the ONNX packages are missing, or the file is not a
                detr_peg export (it must hold the config in its metadata).
        """
        from detr_peg.export.onnx_runtime import OnnxDetector

        return cls(OnnxDetector(path, overrides=overrides).as_loaded_model(), device="cpu")

    @property
    def config(self) -> Config:
        """The resolved config of the model."""
        return self.loaded.config

    @property
    def model(self) -> Any:
        """The ``nn.Module`` (or the ONNX Runtime graph of :meth:`from_onnx`)."""
        return self.loaded.model

    @property
    def label_map(self) -> LabelMap | None:
        """Model label <-> dataset category id and name, if the model came with one."""
        return self.loaded.label_map

    @property
    def class_names(self) -> list[str]:
        """The name of every model label, in label order (``class <label>`` for labels without one)."""
        return [category_of(self.label_map, label)[1] for label in range(self.config.model.num_classes)]

    def predict(
        self, images: ImageInput | Sequence[ImageInput], *, threshold: float | None = None, batch_size: int = 8
    ) -> Detections | list[Detections]:
        """Detect objects in one image or a list of images.

        Args:
            images: one image or a list: paths, PIL images, NumPy ``(H, W, 3)``
                uint8 arrays, ``(3, H, W)`` tensors (uint8, or float in [0, 1]).
            threshold: keep detections scoring at least this
                (default: ``eval.score_threshold`` of the config).
            batch_size: most images per forward pass; images are batched by
                equal size after the resize, so the results do not depend on it.

        Returns:
            :class:`~detr_peg.engine.detections.Detections` for one image, or a
            list of them (input order) for a list.

        Raises:
            DataError: an unreadable file or an input of another kind, naming it.
            ConfigError: ``threshold`` outside [0, 1] or ``batch_size`` below 1.
        """
        single = not isinstance(images, (list, tuple))
        inputs = [images] if single else list(images)
        threshold = self.config.eval.score_threshold if threshold is None else float(threshold)
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be between 0 and 1, got {threshold}.")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}.")
        results = self._detect(inputs, threshold, batch_size)
        return results[0] if single else results

    def _detect(self, inputs: list[ImageInput], threshold: float, batch_size: int) -> list[Detections]:
        from torchvision import tv_tensors

        items, groups = [], {}
        for index, image in enumerate(inputs):
            pixels = as_rgb_tensor(image, name=_describe(image, index))
            model_input = self._transform(tv_tensors.Image(pixels))
            items.append(({"orig_size": torch.tensor(pixels.shape[-2:]), "index": index}, model_input, image))
            groups.setdefault(tuple(model_input.shape[-2:]), []).append(index)
        batches = []
        for indices in groups.values():
            for start in range(0, len(indices), batch_size):
                chunk = [items[i] for i in indices[start : start + batch_size]]
                images, mask = pad_images([t for _, t, _ in chunk], self.loaded.model.size_divisibility)
                batches.append((images, mask, [item for item, _, _ in chunk]))
        results: list[Detections | None] = [None] * len(inputs)
        for batch in run_inference(self.loaded, batches, device=self.device, amp=self.amp):
            for item, detection in zip(batch.items, batch.detections):
                source = items[item["index"]][2]
                results[item["index"]] = Detections.from_postprocessed(
                    detection,
                    threshold=threshold,
                    label_map=self.label_map,
                    image_size=tuple(int(v) for v in item["orig_size"]),
                    source=str(source) if isinstance(source, (str, os.PathLike)) else None,
                )
        return results  # type: ignore[return-value]

    def evaluate(
        self, images: str | os.PathLike, annotations: str | os.PathLike, *, batch_size: int | None = None
    ) -> dict[str, float]:
        """COCO bbox metrics of the model on a COCO-format set.

        Args:
            images: the folder the annotations' ``file_name`` entries are relative to.
            annotations: the COCO-format JSON file.
            batch_size: images per forward pass (default ``eval.batch_size``).

        Returns:
            ``{"AP": ..., "AP50": ..., "AP75": ..., "APs": ..., "APm": ..., "APl": ...,
            "AR1": ..., "AR10": ..., "AR100": ..., "ARs": ..., "ARm": ..., "ARl": ...}``
            as fractions (``-1`` where COCO defines none).

        Raises:
            DataError: unreadable or invalid annotations or images.
        """
        cfg = self.config
        data = replace(cfg.data, val_images=str(images), val_annotations=str(annotations))
        dataset = build_coco_dataset(data, "val", label_map=self.label_map)
        env = DistEnv(device=self.device)
        loader = build_eval_loader(
            dataset,
            batch_size or cfg.eval.batch_size,
            cfg.data.num_workers,
            env,
            size_divisibility=self.loaded.model.size_divisibility,
            padding_mode=cfg.eval.padding_mode,
        )
        out = evaluate(
            self.loaded, loader, coco_gt=dataset.coco, device=self.device, label_map=dataset.label_map, amp=self.amp
        )
        return out.metrics

    def export_onnx(self, path: str | os.PathLike, **options: Any) -> Path:
        """Export the model to an ONNX file; see :func:`detr_peg.export.onnx_export.export_onnx` for ``options``.

        Returns:
            The file written.
        """
        from detr_peg.export.onnx_export import export_onnx

        return export_onnx(self.loaded, path, **options)

    def __repr__(self) -> str:
        m = self.config.model
        return (
            f"Detector({m.arch}, position {m.position.name}, backbone {m.backbone.name}, "
            f"{m.num_classes} classes, device {self.device})"
        )


def _describe(image: Any, index: int) -> str:
    if isinstance(image, (str, os.PathLike)):
        return f"Image {index + 1} ({image})"
    return f"Image {index + 1}"
