"""The object a user holds: :class:`Detector`, a trained model that turns images into boxes.

::

    import detr_peg

    detector = detr_peg.Detector.from_checkpoint("runs/peg/checkpoint.pth")
    detections = detector.predict("photo.jpg", threshold=0.5)
    print(detections.class_names, detections.boxes)          # boxes: x0, y0, x1, y1 pixels
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, overload

import torch

from detr_peg.checkpoint.format import Checkpoint, read_checkpoint
from detr_peg.checkpoint.weights_check import non_finite
from detr_peg.config.loader import CONFIG_OBJECT, checked_config, config_to_dict, config_with, load_config
from detr_peg.config.schema import Config
from detr_peg.data.image_input import MAX_PATH_CHARS, ImageInput, as_rgb_tensor, is_encoded
from detr_peg.data.label_map import LabelMap
from detr_peg.data.padding import pad_images
from detr_peg.data.transforms import build_eval_transforms
from detr_peg.detections import Detections, category_of
from detr_peg.engine.distributed import process_group, resolve_device
from detr_peg.engine.evaluation.evaluate import evaluate_dataset
from detr_peg.engine.evaluation.per_class import Metrics, confusion_matrix
from detr_peg.engine.evaluation.run import load_for_evaluation, run_evaluation
from detr_peg.engine.evaluation.scales import run_scale_evaluation
from detr_peg.engine.inference import run_inference
from detr_peg.engine.mixed_precision import check_amp, evaluation_amp
from detr_peg.errors import CheckpointError, ConfigError
from detr_peg.hub import HubFolders
from detr_peg.models.builder import torch_defaults
from detr_peg.models.loading import LoadedModel, load_model, model_from_checkpoint
from detr_peg.outputs import Input, Output, guard_outputs


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(t.shape) for key, t in state.items()}


class Detector(HubFolders):
    """A detector ready for inference: model, post-processor, label map, device and precision.

    Build one with :meth:`from_checkpoint`, :meth:`from_pretrained`, :meth:`from_config` or
    :meth:`from_onnx`, or train one with :meth:`train`. ``device``: ``auto`` (a GPU when there is one), ``cpu``,
    ``cuda`` or ``cuda:N``. ``amp``: ``predict`` runs in float32 (``none``), as the ONNX graph does, so the two
    give the same detections; set ``detector.amp = "auto"`` (or ``bf16``, ``fp16``) for autocast.
    ``evaluate`` runs as ``detr-peg eval`` does, with the config's ``train.amp``.
    """

    def __init__(self, loaded: LoadedModel, *, device: str | torch.device = "auto") -> None:
        if not isinstance(loaded, LoadedModel):
            raise TypeError(f"Detector(...) takes a LoadedModel, got {type(loaded).__name__}; use Detector.from_checkpoint, "
                            "from_pretrained, from_onnx or from_config.")  # fmt: skip
        self.loaded = loaded
        self.device = resolve_device(str(device), name="device")  # a torch.device("meta") too, as "meta" is
        if isinstance(loaded.model, torch.nn.Module):
            loaded.to(self.device).model.eval()
        else:  # an ONNX Runtime graph runs on the CPU
            self.device = torch.device("cpu")
        named = loaded.config.train.device  # a device the config names is the one the detector runs on
        if named != "auto" and torch.device(named) != self.device and (named, self.device.type) != ("cuda", "cuda"):
            loaded.config = replace(loaded.config, train=replace(loaded.config.train, device=str(self.device)))
        self.amp = "none"
        self._transform = build_eval_transforms(loaded.config.data)
        self._shapes = _shapes(loaded.model.state_dict()) if isinstance(loaded.model, torch.nn.Module) else {}

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

        ``overrides``: ``key=value`` config changes that do not alter weights (``eval.score_threshold=0.3``);
        ``config`` replaces the stored config (same model); ``overrides_source`` names the overrides in messages.
        Raises ``CheckpointError`` for an unreadable, unsafe or unfitting checkpoint, ``ConfigError`` for a bad
        override or config.
        """
        if config is None:
            return cls(load_model(path, overrides=overrides, overrides_source=overrides_source), device=device)
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config (detr_peg.load_config), got {type(config).__name__}.")
        checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
        return cls(model_from_checkpoint(checkpoint, checked_config(config)), device=device)

    @classmethod
    def from_config(
        cls,
        config: str | os.PathLike | Config,
        overrides: Iterable[str] = (),
        *,
        label_map: LabelMap | None = None,
        device: str | torch.device = "auto",
    ) -> Detector:
        """A freshly built model (random, or the config's backbone weights); ``model.num_classes`` must be set."""
        base = config_to_dict(checked_config(config)) if isinstance(config, Config) else None
        cfg = load_config(None if base else config, overrides, base=base, base_source=CONFIG_OBJECT,
                          overrides_source="overrides")  # fmt: skip
        if label_map is not None and not isinstance(label_map, LabelMap):
            raise TypeError(f"label_map must be a LabelMap (detr_peg.data.label_map), got {type(label_map).__name__}.")
        return cls(LoadedModel.from_config(cfg, label_map=label_map), device=device)

    @classmethod
    def from_onnx(cls, path: str | os.PathLike, *, overrides: Iterable[str] = ()) -> Detector:
        """A graph written by :meth:`export_onnx`, run in ONNX Runtime on the CPU.

        Raises ``UserError``: the ONNX packages are missing, or the file is not a detr_peg export.
        """
        from detr_peg.export.onnx_runtime import OnnxDetector

        return cls(OnnxDetector(path, overrides=overrides).as_loaded_model(), device="cpu")

    @property
    def config(self) -> Config:
        """A copy of the model's resolved config: changing it changes no detector (``from_checkpoint(config=...)``
        builds one from a changed config, checked against the weights)."""
        return copy.deepcopy(self.loaded.config)

    @property
    def model(self) -> Any:
        """The ``nn.Module`` (or the ONNX Runtime graph of :meth:`from_onnx`)."""
        return self.loaded.model

    @property
    def label_map(self) -> LabelMap | None:
        """Model label <-> dataset category id and name, if the model came with one; a copy, as :attr:`config`."""
        return copy.deepcopy(self.loaded.label_map)

    @property
    def class_names(self) -> list[str]:
        """The name of every model label, in label order (``class <label>`` for labels without one)."""
        return [category_of(self.loaded.label_map, label)[1] for label in range(self.loaded.config.model.num_classes)]

    @overload
    def predict(self, images: ImageInput, *, threshold: float | None = ..., batch_size: int = ...,
                channels: Literal["RGB", "BGR"] = ...) -> Detections: ...  # fmt: skip
    @overload
    def predict(self, images: Sequence[ImageInput] | Iterator[ImageInput], *, threshold: float | None = ...,
                batch_size: int = ..., channels: Literal["RGB", "BGR"] = ...) -> list[Detections]: ...  # fmt: skip
    def predict(
        self,
        images: ImageInput | Sequence[ImageInput] | Iterator[ImageInput],
        *,
        threshold: float | None = None,
        batch_size: int = 8,
        channels: Literal["RGB", "BGR"] = "RGB",
    ) -> Detections | list[Detections]:
        """Detect objects in one image or a sequence (or iterator) of images.

        ``images``: paths, PIL images, NumPy ``(H, W, 3)`` uint8 arrays or ``(3, H, W)`` tensors (uint8, or float in
        [0, 1]); arrays and tensors are RGB, or BGR with ``channels="BGR"`` (OpenCV's frames; files are refused). ``threshold`` defaults to
        ``eval.score_threshold``; results depend on ``batch_size`` only by float rounding. Returns one
        :class:`~detr_peg.detections.Detections` (boxes x0, y0, x1, y1 pixels), or a list in input order.
        Raises ``DataError`` (unreadable input) or ``ConfigError`` (bad threshold or batch size)."""
        # A generator is a list; bytes and streams are one input each (refused), never iterated.
        single = isinstance(images, str) or is_encoded(images) or not isinstance(images, (Sequence, Iterator))
        inputs = [images] if single else list(images)
        threshold = self.loaded.config.eval.score_threshold if threshold is None else threshold
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 <= threshold <= 1:
            raise ConfigError(f"threshold must be a number from 0 to 1, got {threshold!r}.")  # NumPy's too; not NaN
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or not 1 <= batch_size <= 1e5:
            raise ConfigError(f"batch_size must be a whole number from 1 to 100000, got {batch_size!r}.")
        results = self._detect(inputs, float(threshold), int(batch_size), channels)
        return results[0] if single else results

    def _checked(self) -> LoadedModel:
        """:attr:`loaded`, its weights checked to be finite float32 tensors on :attr:`device`, parameters still
        :class:`~torch.nn.Parameter`, of the shapes of its config: what predict, evaluate, export and save run."""
        model = self.model if isinstance(self.model, torch.nn.Module) else torch.nn.Module()
        state = model.state_dict()
        for key, t in state.items():
            if not isinstance(t, torch.Tensor):  # a quantized module's packed parameters
                raise ConfigError(f"detector.model's '{key}' is a {type(t).__name__}, not a tensor: the detector runs "
                                  "the float32 model of its config, not a quantized or converted one.")  # fmt: skip
            if t.is_floating_point() and (t.dtype != torch.float32 or t.device != self.device):
                raise ConfigError(f"detector.model holds {t.dtype} weights on {t.device}, but the detector runs float32 "
                                  f"on {self.device} (detector.amp sets autocast): call "
                                  "detector.model.float().to(detector.device).")  # fmt: skip
        for key in (k for k, p in model.named_parameters() if not isinstance(p, torch.nn.Parameter)):
            raise ConfigError(f"detector.model's parameter '{key}' is a plain tensor now (torch.func.functional_call "
                              "leaves one so in a module registered twice): load the detector again.")  # fmt: skip
        shapes = _shapes(state)
        if shapes != self._shapes:  # one dict comparison per call; the key is looked for only when they differ
            key = next(k for k in sorted(shapes.keys() | self._shapes.keys()) if shapes.get(k) != self._shapes.get(k))
            reparametrized = any(k.endswith("_orig") or ".parametrizations." in k for k in shapes)  # prune, parametrize
            fix = ("call torch.nn.utils.prune.remove or parametrize.remove_parametrizations first" if reparametrized
                   else "a model of other sizes needs its own config (fine_tune, or Detector.from_config)")  # fmt: skip
            raise ConfigError(f"detector.model's '{key}' is {shapes.get(key, 'gone')}, not the {self._shapes.get(key)} "
                              f"of its config and label map: {fix}.")  # fmt: skip
        sums = [t.sum() for t in state.values() if t.is_floating_point()]  # NaN or inf anywhere spoils a sum
        for key, count, example in non_finite(state) if sums and not torch.stack(sums).isfinite().all() else ():
            raise CheckpointError(f"detector.model's '{key}' holds {count} non-finite values ({example}): its outputs "
                                  "would be wrong, and such weights are not written.")  # fmt: skip
        return self.loaded

    @torch_defaults()  # float32 and the CPU as torch's defaults, whatever the caller set
    def _detect(
        self, inputs: list[ImageInput], threshold: float, batch_size: int, channels: str = "RGB"
    ) -> list[Detections]:
        from torchvision import tv_tensors

        loaded = self._checked()

        items, groups = [], {}
        for index, image in enumerate(inputs):
            pixels = as_rgb_tensor(image, name=_describe(image, index), channels=channels)
            model_input = self._transform(tv_tensors.Image(pixels))
            items.append(({"orig_size": torch.tensor(pixels.shape[-2:]), "index": index}, model_input, image))
            groups.setdefault(tuple(model_input.shape[-2:]), []).append(index)
        batches = []
        for indices in groups.values():
            for start in range(0, len(indices), batch_size):
                chunk = [items[i] for i in indices[start : start + batch_size]]
                images, mask = pad_images([t for _, t, _ in chunk], loaded.model.size_divisibility)
                batches.append((images, mask, [item for item, _, _ in chunk]))
        results: list[Detections | None] = [None] * len(inputs)
        for batch in run_inference(loaded, batches, device=self.device, amp=self.amp):
            for item, detection in zip(batch.items, batch.detections):
                source = items[item["index"]][2]
                results[item["index"]] = Detections.from_postprocessed(
                    detection,
                    threshold=threshold,
                    label_map=self.loaded.label_map,
                    image_size=tuple(int(v) for v in item["orig_size"]),
                    source=os.fsdecode(source) if isinstance(source, (str, os.PathLike)) else None,
                )
        return results  # type: ignore[return-value]

    @torch_defaults()
    def evaluate(
        self,
        images: str | os.PathLike | None = None,
        annotations: str | os.PathLike | None = None,
        *,
        batch_size: int | None = None,
        output_dir: str | os.PathLike | None = None,
        extra_inputs: Sequence[Input] = (),
        progress_bars: bool | None = None,
    ) -> Metrics:
        """COCO bbox metrics (percent, 0-100; ``-1`` where COCO defines none) on a COCO- or YOLO-format set.

        Runs in the current process group (``torchrun`` shares the images out). ``images`` and ``annotations``
        default to ``data.val_images`` / ``data.val_annotations``; with ``output_dir`` it also writes
        ``metrics.json``, ``detections.json``, ``per_class.csv`` and ``confusion_matrix.json`` there. Returns
        ``{"AP", "AP50", ..., "ARl"}`` with ``.per_class`` and ``.confusion`` (see :class:`Metrics`). Raises
        ``UserError`` for bad data or an unwritable folder.
        """
        cfg, checked = self._evaluation_config(images, annotations, batch_size), self._checked()
        with process_group(str(self.device)) as env:
            if output_dir is not None:
                run = run_evaluation(cfg, checked, output_dir, extra_inputs=extra_inputs, progress_bars=progress_bars)
                return Metrics(run.metrics, run.per_class, run.confusion)
            loaded, dataset, _ = load_for_evaluation(cfg, checked, env)
            out = evaluate_dataset(loaded, dataset, env, amp=evaluation_amp(self.loaded.config.train.amp, self.device))
            confusion = confusion_matrix(dataset.coco, out.detections) if env.is_main else None
            return Metrics(out.metrics, out.per_class, confusion)

    @torch_defaults()
    def evaluate_scales(
        self,
        output_dir: str | os.PathLike,
        *,
        scales: Sequence[float] = (),
        canvas_scales: Sequence[float] = (),
        padding: bool = False,
    ) -> dict[str, Path]:
        """The evaluation of ``detr-peg eval --scales/--canvas-scales/--padding``; the files written, by kind."""
        return run_scale_evaluation(
            self.loaded.config, self._checked(), output_dir, scales=scales, canvas_scales=canvas_scales, padding=padding
        )

    def _evaluation_config(
        self, images: str | os.PathLike | None, annotations: str | os.PathLike | None, batch_size: int | None
    ) -> Config:
        cfg = self.loaded.config
        given = {"data.val_images": images, "data.val_annotations": annotations, "eval.batch_size": batch_size}
        given = {key: os.fsdecode(v) if isinstance(v, os.PathLike) else v for key, v in given.items() if v is not None}
        cfg = config_with(cfg, given, "evaluate")
        if not (cfg.data.val_images and cfg.data.val_annotations):
            raise ConfigError(
                "evaluate needs images and annotations (or data.val_images and data.val_annotations in the config)."
            )
        return cfg

    @classmethod
    def train(
        cls,
        config: str | os.PathLike | Config | None,
        output_dir: str | os.PathLike,
        *,
        train_images: str | os.PathLike,
        train_annotations: str | os.PathLike,
        val_images: str | os.PathLike | None = None,
        val_annotations: str | os.PathLike | None = None,
        overrides: Iterable[str] = (),
        device: str | torch.device = "auto",
        progress_bars: bool | None = None,
    ) -> Detector:
        """Train from a config on a COCO- or YOLO-format dataset as ``detr-peg train`` does (``model.num_classes`` from the
        data; ``config=None``: the defaults, as without ``--config``; without ``val_*``, the config's validation data);
        the run goes into ``output_dir``. Returns its :class:`Detector`; ``UserError`` on bad input."""
        stored = config_to_dict(checked_config(config) if isinstance(config, Config) else load_config(config))
        if val_images is None and val_annotations is None:
            val_images, val_annotations = stored["data"]["val_images"], stored["data"]["val_annotations"]
        source = CONFIG_OBJECT if isinstance(config, Config) else os.fsdecode(config) if config is not None else "None"
        return cls._train(
            stored, output_dir, (train_images, train_annotations, val_images, val_annotations),
            overrides, str(device), progress_bars, init_from=None, source=source,
        )  # fmt: skip

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
        """Train on a COCO-format dataset from this detector's weights file (``detr-peg train`` with ``train.init_from``;
        a detector of :meth:`from_config` has none, so its run starts from the config's initialisation).

        ``overrides`` (``key=value``) change the config; another number of categories needs
        ``train.reset_classifier=true``; without ``val_images``/``val_annotations`` the run does not evaluate.
        Writes a training run into ``output_dir`` (``checkpoint.pth``, ``config.yaml``, ``metrics.jsonl``);
        a folder holding a run's checkpoint is refused unless ``train.resume=true``.
        Returns a :class:`Detector` of ``output_dir/checkpoint.pth`` on this device. Raises ``UserError``
        (ONNX detector, bad override or data, unfitting weights, occupied output folder).
        """
        if not isinstance(self.model, torch.nn.Module):
            raise ConfigError(
                "A detector from an ONNX graph has no weights to train; fine-tune the checkpoint it was "
                "exported from (Detector.from_checkpoint)."
            )
        source = self.loaded.source
        if source is not None and not os.path.isfile(source):
            raise ConfigError(
                f"No file holds the weights of {source} (converted from Transformers when read, or moved or deleted "
                "since); write one with detector.save_pretrained(folder) and fine-tune Detector.from_pretrained(folder)."
            )
        return self._train(
            config_to_dict(self.loaded.config), output_dir, (train_images, train_annotations, val_images, val_annotations),
            overrides, str(self.device), progress_bars, init_from=source, source="the config of the detector",
        )  # fmt: skip

    @classmethod
    @torch_defaults()
    def _train(
        cls, stored: dict, output_dir: Any, data: tuple, overrides: Iterable[str], device: str,
        progress_bars: bool | None, *, init_from: str | None, source: str,
    ) -> Detector:  # fmt: skip
        from detr_peg.engine.training import run_training

        train_images, train_annotations, val_images, val_annotations = data
        if (val_images is None) != (val_annotations is None):
            given = "val_images" if val_annotations is None else "val_annotations"
            raise ConfigError(
                f"Training got {given} alone: val_images and val_annotations go together; give both to evaluate "
                "the run, or neither."
            )
        stored["model"]["num_classes"] = None  # taken from the dataset
        stored["data"].update(
            train_images=os.fsdecode(train_images),
            train_annotations=os.fsdecode(train_annotations),
            val_images=None if val_images is None else os.fsdecode(val_images),
            val_annotations=None if val_annotations is None else os.fsdecode(val_annotations),
        )
        stored["train"].update(resume=False, init_from=init_from, reset_classifier=False)  # the earlier run's start
        cfg = load_config(None, overrides, base=stored, base_source=source, overrides_source="overrides")
        given = {"train.output_dir": os.fsdecode(output_dir), "train.device": device}  # win, as the command's options
        result = run_training(config_with(cfg, given, "arguments"), progress_bars=progress_bars)
        return cls.from_checkpoint(result.checkpoint, device=device)

    @torch_defaults()
    def export_onnx(self, path: str | os.PathLike, **options: Any) -> Path:
        """Write the model to an ONNX file (``options``: see :func:`detr_peg.export.onnx_export.export_onnx`); the path.

        Never overwrites a file that is not an earlier detr_peg export (``OutputError``, file left as it was).
        """
        from detr_peg.export.onnx_export import export_onnx

        if not isinstance(self.model, torch.nn.Module):
            raise ConfigError(f"This detector runs the ONNX graph {self.model.path}, an export already; export the "
                              "checkpoint it was exported from (Detector.from_checkpoint).")  # fmt: skip
        loaded = self._checked()
        with guard_outputs("export", [], [Output(path, "path")]):
            return export_onnx(loaded, path, **options)

    @property
    def amp(self) -> str:
        """The autocast of ``predict``: ``none`` (float32), ``auto``, ``bf16`` or ``fp16``; checked when set."""
        return self._amp

    @amp.setter
    def amp(self, value: str) -> None:
        check_amp(value, self.device, key="Detector.amp")
        if value != "none" and not isinstance(self.model, torch.nn.Module):
            raise ConfigError(f"Detector.amp {value!r}: an ONNX graph runs in float32; leave amp at 'none'.")
        self._amp = value

    def __repr__(self) -> str:
        m = self.loaded.config.model
        return (
            f"Detector({m.arch}, position {m.position.name}, backbone {m.backbone.name}, "
            f"{m.num_classes} classes, device {self.device})"
        )


def _describe(image: Any, index: int) -> str:
    if isinstance(image, (str, os.PathLike)) and len(str(image)) <= MAX_PATH_CHARS:
        return f"Image {index + 1} ({image})"
    return f"Image {index + 1}"
