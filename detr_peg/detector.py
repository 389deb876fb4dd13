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
COCO-format set (in the current process group, so ``torchrun`` shares the
images out), ``export_onnx`` writes an ONNX graph and ``fine_tune`` trains
the model further on a COCO-format dataset (the run of ``detr-peg train``
with ``train.init_from``), returning the trained detector. The command line's
``predict``, ``eval`` and ``demo`` are thin wrappers over this class, and
every path runs the one inference loop
(:func:`~detr_peg.engine.inference.run_inference`). ``save_pretrained``,
``from_pretrained`` and ``push_to_hub`` come from
:class:`~detr_peg.hub.HubFolders` (Hugging Face Hub folders, and
Transformers DETR checkpoints converted on loading).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.config.loader import config_to_dict, load_config
from detr_peg.config.schema import Config
from detr_peg.data.image_input import ImageInput, as_rgb_tensor
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.engine.detections import Detections, category_of
from detr_peg.engine.distributed import process_group, resolve_device
from detr_peg.engine.evaluation.evaluate import evaluate_dataset
from detr_peg.engine.evaluation.run import load_for_evaluation, run_evaluation
from detr_peg.engine.evaluation.scales import run_scale_evaluation
from detr_peg.engine.inference import run_inference
from detr_peg.engine.mixed_precision import evaluation_amp
from detr_peg.errors import ConfigError
from detr_peg.guards.output_guard import Input, Output, guard_outputs
from detr_peg.hub import HubFolders
from detr_peg.models.loading import LoadedModel, load_model, model_from_checkpoint


class Detector(HubFolders):
    """A detector ready for inference: model, post-processor, label map, device and precision.

    Build one with :meth:`from_checkpoint`, :meth:`from_pretrained` (a Hub
    folder, see :class:`~detr_peg.hub.HubFolders`), :meth:`from_config` or
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
        cls,
        path: str | os.PathLike | Checkpoint,
        *,
        device: str | torch.device = "auto",
        overrides: Iterable[str] = (),
        config: Config | None = None,
        overrides_source: str = "overrides",
    ) -> Detector:
        """The model of a detr_peg checkpoint (``.pth`` or ``.safetensors`` file, URL, or one already read).

        Args:
            path: the checkpoint.
            device: see the class.
            overrides: ``key=value`` config changes that do not alter weights
                (``data.val_scale=512``, ``eval.score_threshold=0.3``).
            config: use this config instead of the stored one (it must
                describe the same model; ``detr-peg eval`` passes the stored
                config with ``--config`` and the overrides applied).
            overrides_source: how messages name where ``overrides`` came from
                (``detr-peg predict`` passes ``"command line"``).

        Raises:
            CheckpointError: unreadable, unsafe or unfitting checkpoint.
        """
        if config is None:
            return cls(load_model(path, overrides=overrides, overrides_source=overrides_source), device=device)
        checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
        return cls(model_from_checkpoint(checkpoint, config), device=device)

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
            cfg = (
                load_config(None, overrides, base=config_to_dict(config), overrides_source="overrides")
                if overrides
                else config
            )
        else:
            cfg = load_config(config, overrides, overrides_source="overrides")
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
        self,
        images: str | os.PathLike | None = None,
        annotations: str | os.PathLike | None = None,
        *,
        batch_size: int | None = None,
        output_dir: str | os.PathLike | None = None,
        extra_inputs: Sequence[Input] = (),
        progress_bars: bool | None = None,
    ) -> dict[str, float]:
        """COCO bbox metrics of the model on a COCO-format set.

        Runs in the current process group (every process of a ``torchrun``
        launch calls it and the images are shared out), in one process otherwise.

        Args:
            images: the folder the annotations' ``file_name`` entries are
                relative to (default ``data.val_images`` of the config).
            annotations: the COCO-format JSON file (default ``data.val_annotations``).
            batch_size: images per forward pass (default ``eval.batch_size``).
            output_dir: also write ``metrics.json`` and ``detections.json``
                there and print the table (what ``detr-peg eval`` does).
            extra_inputs: more files the caller read, which the outputs must not overlap.
            progress_bars: show a bar with ``output_dir``; ``None``: when stderr is a terminal.

        Returns:
            ``{"AP": ..., "AP50": ..., "AP75": ..., "APs": ..., "APm": ..., "APl": ...,
            "AR1": ..., "AR10": ..., "AR100": ..., "ARs": ..., "ARm": ..., "ARl": ...}``
            in percent, 0-100 (``-1`` where COCO defines none).

        Raises:
            UserError: unreadable or invalid annotations or images, a data set
                with more classes than the model, an unwritable ``output_dir``.
        """
        cfg = self._evaluation_config(images, annotations, batch_size)
        with process_group(str(self.device)) as env:
            if output_dir is not None:
                run = run_evaluation(
                    cfg, self.loaded, output_dir, extra_inputs=extra_inputs, progress_bars=progress_bars
                )
                return run.metrics
            loaded, dataset, _ = load_for_evaluation(cfg, self.loaded, env)
            out = evaluate_dataset(loaded, dataset, env, amp=self.amp)
            return out.metrics

    def evaluate_scales(
        self,
        output_dir: str | os.PathLike,
        *,
        scales: Sequence[float] = (),
        canvas_scales: Sequence[float] = (),
        padding: bool = False,
    ) -> dict[str, Path]:
        """The multi-resolution evaluation of ``detr-peg eval --scales/--canvas-scales/--padding``.

        See :mod:`detr_peg.engine.evaluation.scales` for the two kinds of test
        size and :mod:`detr_peg.engine.evaluation.padding` for the padding comparison.

        Returns:
            The files written, by kind (``resized``, ``canvas``, ``padding``).
        """
        return run_scale_evaluation(
            self.config, self.loaded, output_dir, scales=scales, canvas_scales=canvas_scales, padding=padding
        )

    def _evaluation_config(
        self, images: str | os.PathLike | None, annotations: str | os.PathLike | None, batch_size: int | None
    ) -> Config:
        cfg = self.config
        data = replace(
            cfg.data,
            val_images=str(images) if images is not None else cfg.data.val_images,
            val_annotations=str(annotations) if annotations is not None else cfg.data.val_annotations,
        )
        if not (data.val_images and data.val_annotations):
            raise ConfigError(
                "evaluate needs images and annotations (or data.val_images and data.val_annotations in the config)."
            )
        evaluation = replace(cfg.eval, batch_size=batch_size) if batch_size is not None else cfg.eval
        return replace(cfg, data=data, eval=evaluation)

    def fine_tune(
        self,
        output_dir: str | os.PathLike,
        *,
        train_images: str | os.PathLike,
        train_annotations: str | os.PathLike,
        val_images: str | os.PathLike | None = None,
        val_annotations: str | os.PathLike | None = None,
        overrides: Iterable[str] = (),
        progress_bars: bool | None = None,
    ) -> Detector:
        """Train on a COCO-format dataset, starting from this detector's checkpoint; the trained detector.

        The run is the one ``detr-peg train`` makes of this detector's config
        with the dataset replaced, ``train.init_from`` set to the checkpoint the
        detector was loaded from (a detector built from a config trains from that
        config, with the backbone weights it names) and ``model.num_classes``
        taken from the dataset; ``overrides`` (``key=value``) change the rest
        (``train.epochs=12``, ``train.lr=5e-5``). A dataset with another number
        of categories needs ``train.reset_classifier=true`` (a fresh
        classification head; the message says so). The output folder gets what
        a training run writes (``checkpoint.pth``, ``config.yaml``,
        ``metrics.jsonl``). A folder that already holds a run's checkpoint is
        refused; the same call with ``train.resume=true`` (and a longer
        ``train.max_iters`` or ``train.epochs``) in ``overrides`` continues that
        run, as ``--resume`` does on the command line.

        Args:
            output_dir: the run's folder (``train.output_dir``).
            train_images: the folder the training annotations' ``file_name`` entries are relative to.
            train_annotations: the training set's COCO-format JSON file.
            val_images: the validation images; without them and ``val_annotations`` the run does not evaluate.
            val_annotations: the validation set's COCO-format JSON file.
            overrides: further ``key=value`` config changes.
            progress_bars: show tqdm bars; ``None``: when stderr is a terminal.

        Returns:
            A :class:`Detector` of the trained weights (``output_dir/checkpoint.pth``), on this detector's device.

        Raises:
            UserError: a detector from an ONNX graph (it has no weights to train), a bad
                override, unreadable data, weights that do not fit the dataset, an output folder that
                already holds a run's checkpoint (without ``train.resume=true``).
        """
        from detr_peg.engine.training import run_training

        if not isinstance(self.model, torch.nn.Module):
            raise ConfigError(
                "A detector from an ONNX graph has no weights to train; fine-tune the checkpoint it was "
                "exported from (Detector.from_checkpoint)."
            )
        if (val_images is None) != (val_annotations is None):
            given = "val_images" if val_annotations is None else "val_annotations"
            raise ConfigError(
                f"fine_tune got {given} alone: val_images and val_annotations go together; give both to evaluate "
                "the run, or neither."
            )
        stored = config_to_dict(self.config)
        stored["model"]["num_classes"] = None  # taken from the dataset
        stored["data"].update(
            train_images=str(train_images),
            train_annotations=str(train_annotations),
            val_images=None if val_images is None else str(val_images),
            val_annotations=None if val_annotations is None else str(val_annotations),
        )
        stored["train"].update(
            output_dir=str(output_dir), resume=False, init_from=self.loaded.source, device=str(self.device)
        )
        cfg = load_config(
            None, overrides, base=stored, base_source="the config of the detector", overrides_source="overrides"
        )
        result = run_training(cfg, progress_bars=progress_bars)
        return Detector.from_checkpoint(result.checkpoint, device=self.device)

    def export_onnx(self, path: str | os.PathLike, **options: Any) -> Path:
        """Export the model to an ONNX file; see :func:`detr_peg.export.onnx_export.export_onnx` for ``options``.

        The file is written under the rules of ``detr-peg export``: never over a file detr_peg did not write
        as an export (a training checkpoint, a user's file), never into a folder a running command holds.

        Returns:
            The file written.

        Raises:
            OutputError: ``path`` is a folder, or a file that is not an earlier export (it is left as it was).
        """
        from detr_peg.export.onnx_export import export_onnx

        with guard_outputs("export", [], [Output(Path(path), "path")]):
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
