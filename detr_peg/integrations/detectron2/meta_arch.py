"""detr_peg detectors as detectron2 meta-architectures (``DetrPegModel``, and one per architecture).

Targets become normalised (cx, cy, w, h) of the unpadded image; the mask is True on padding.
Inference returns ``[{"instances": Instances}]`` with absolute x0, y0, x1, y1 boxes.
"""

from __future__ import annotations

import torch
from detectron2.config import configurable
from detectron2.modeling import META_ARCH_REGISTRY, detector_postprocess
from detectron2.structures import Boxes, Instances
from torch import Tensor, nn
from torchvision.ops import box_convert

from detr_peg.data.padding import pad_images
from detr_peg.errors import ConfigError
from detr_peg.integrations.detectron2.config import detr_peg_config
from detr_peg.models.builder import build_criterion, build_model, build_postprocessor
from detr_peg.models.registry import MODELS

INPUT_FORMATS = ("RGB", "BGR")


@META_ARCH_REGISTRY.register()
class DetrPegModel(nn.Module):
    """A detr_peg detector (the architecture of the detr_peg config) with pluggable positional encodings.

    ``pixel_mean`` / ``pixel_std``: 0-255 scale, in ``input_format`` (``RGB`` or ``BGR``) order.
    """

    #: The detr_peg ``model.arch`` this meta-architecture builds (None: the one of the detr_peg config).
    arch: str | None = None

    @configurable
    def __init__(
        self,
        *,
        detector: nn.Module,
        criterion: nn.Module,
        postprocessor: nn.Module,
        pixel_mean: list[float],
        pixel_std: list[float],
        input_format: str = "RGB",
    ) -> None:
        super().__init__()
        if input_format not in INPUT_FORMATS:
            raise ConfigError(f"cfg.INPUT.FORMAT {input_format!r} is not supported: use 'RGB' or 'BGR'.")
        if len(pixel_mean) != 3 or len(pixel_std) != 3:
            raise ConfigError("cfg.MODEL.PIXEL_MEAN and cfg.MODEL.PIXEL_STD need 3 values each.")
        self.detector = detector
        self.criterion = criterion
        self.postprocessor = postprocessor
        self.input_format = input_format
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(3, 1, 1), persistent=False)

    @classmethod
    def from_config(cls, cfg) -> dict:
        config = detr_peg_config(cfg, arch=cls.arch)
        return {
            "detector": build_model(config),
            "criterion": build_criterion(config),
            "postprocessor": build_postprocessor(config),
            "pixel_mean": list(cfg.MODEL.PIXEL_MEAN),
            "pixel_std": list(cfg.MODEL.PIXEL_STD),
            "input_format": cfg.INPUT.FORMAT,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def preprocess_images(self, batched_inputs: list[dict]) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
        """``(images [B, 3, H, W] zero-padded RGB, mask [B, H, W] True = padding, unpadded (h, w) sizes)``."""
        images = []
        for item in batched_inputs:
            image = (item["image"].to(self.device).float() - self.pixel_mean) / self.pixel_std
            images.append(image.flip(0) if self.input_format == "BGR" else image)
        batch, mask = pad_images(images, size_divisibility=self.detector.size_divisibility)
        return batch, mask, [tuple(image.shape[-2:]) for image in images]

    def prepare_targets(self, batched_inputs: list[dict], sizes: list[tuple[int, int]]) -> list[dict]:
        """detectron2 ``Instances`` -> detr_peg targets (``labels`` int64, ``boxes`` normalised cxcywh)."""
        targets = []
        for item, (h, w) in zip(batched_inputs, sizes):
            if "instances" not in item:
                raise ValueError("training inputs need 'instances' (use DetrPegDatasetMapper with is_train=True)")
            classes = item["instances"].gt_classes
            if len(classes) and not 0 <= int(classes.min()) <= int(classes.max()) < self.criterion.num_classes:
                # Checked before moving to the device (no GPU sync); an id equal to num_classes
                # would silently mean "no object" to DETR's softmax loss.
                bad = int(classes.max()) if int(classes.min()) >= 0 else int(classes.min())
                raise ConfigError(
                    f"cfg.MODEL.DETR_PEG.NUM_CLASSES is {self.criterion.num_classes} but the data has class id "
                    f"{bad}, outside 0..{self.criterion.num_classes - 1}; set NUM_CLASSES to the dataset's "
                    "number of classes."
                )
            instances = item["instances"].to(self.device)
            scale = torch.tensor([w, h, w, h], dtype=torch.float32, device=self.device)
            boxes = box_convert(instances.gt_boxes.tensor.float() / scale, "xyxy", "cxcywh")
            targets.append({"labels": instances.gt_classes.long(), "boxes": boxes})
        return targets

    def forward(self, batched_inputs: list[dict]) -> dict[str, Tensor] | list[dict[str, Instances]]:
        """Training: ``{loss name: weighted 0-dim Tensor}``; inference: per image ``{"instances": Instances}``."""
        images, mask, sizes = self.preprocess_images(batched_inputs)
        outputs = self.detector(images, mask)
        if self.training:
            losses = self.criterion(outputs, self.prepare_targets(batched_inputs, sizes))
            weights = self.criterion.weight_dict
            return {name: value * weights[name] for name, value in losses.items() if name in weights}
        return self.inference(outputs, batched_inputs, sizes)

    @torch.no_grad()
    def inference(
        self, outputs: dict, batched_inputs: list[dict], sizes: list[tuple[int, int]]
    ) -> list[dict[str, Instances]]:
        """Post-process, wrap in ``Instances`` and rescale to the requested output sizes."""
        target_sizes = torch.tensor(sizes, device=self.device)
        results = []
        for detections, item, size in zip(self.postprocessor(outputs, target_sizes), batched_inputs, sizes):
            instances = Instances(size)
            instances.pred_boxes = Boxes(detections["boxes"])
            instances.scores = detections["scores"]
            instances.pred_classes = detections["labels"]
            height, width = item.get("height", size[0]), item.get("width", size[1])
            results.append({"instances": detector_postprocess(instances, height, width)})
        return results


def _register_families() -> dict[str, type[DetrPegModel]]:
    """One meta-architecture per registered architecture that names its ``detectron2_name``."""
    classes = {}
    for arch in MODELS.names():
        name = MODELS.get(arch).detectron2_name
        if name is not None:
            doc = f"A :class:`DetrPegModel` that builds ``model.arch: {arch}`` only."  # not read from __doc__ (-OO)
            cls = type(name, (DetrPegModel,), {"arch": arch, "__doc__": doc, "__module__": __name__})
            META_ARCH_REGISTRY.register(cls)  # detectron2's register(obj) returns None
            classes[name] = cls
    return classes


#: detectron2 meta-architecture name -> class, from the architectures' registrations.
FAMILY_META_ARCHITECTURES = _register_families()
DetrPeg = FAMILY_META_ARCHITECTURES["DetrPeg"]
DeformableDetrPeg = FAMILY_META_ARCHITECTURES["DeformableDetrPeg"]
