"""detr_peg: DETR and Deformable-DETR with CPVT's Positional Encoding Generator.

Public API::

    import detr_peg

    detector = detr_peg.Detector.from_checkpoint("model.pth")   # a trained or converted checkpoint
    detector = detr_peg.Detector.from_pretrained("owner/name")  # a Hub folder (detr_peg's, or Transformers' DETR)
    detections = detector.predict("photo.jpg")                   # boxes (x0, y0, x1, y1 px), scores, class names
    metrics = detector.evaluate("images/", "annotations.json")   # COCO AP, AP50, ...

    cfg = detr_peg.load_config("configs/detr_r50_peg.yaml", ["model.num_classes=91"])
    model = detr_peg.build_model(cfg)            # random init (or configured backbone weights)
    out = model(images, mask)                    # Tensor[B, 3, H, W] + Tensor[B, H, W] (True = padding)

Every error a user can fix is a ``detr_peg.UserError``; anything else is a bug. Names are imported lazily.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from detr_peg.lazy_exports import lazy_exports as _lazy_exports

if TYPE_CHECKING:  # what type checkers and editors see of the names below (py.typed)
    from detr_peg.config import Config, load_config  # noqa: F401
    from detr_peg.detections import Detections  # noqa: F401
    from detr_peg.detector import Detector  # noqa: F401
    from detr_peg.engine.evaluation.run import run_evaluation  # noqa: F401
    from detr_peg.engine.training import run_training  # noqa: F401
    from detr_peg.errors import UserError  # noqa: F401
    from detr_peg.models import build_criterion, build_model, build_postprocessor  # noqa: F401
    from detr_peg.models.loading import LoadedModel, load_model  # noqa: F401

try:  # the version of the installed distribution (pyproject.toml's, in an editable install too)
    __version__ = importlib.metadata.version("detr_peg")
except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path that was never installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {
    "Detector": "detr_peg.detector",
    "Detections": "detr_peg.detections",
    "Config": "detr_peg.config",
    "load_config": "detr_peg.config",
    "build_model": "detr_peg.models",
    "build_criterion": "detr_peg.models",
    "build_postprocessor": "detr_peg.models",
    "load_model": "detr_peg.models.loading",
    "LoadedModel": "detr_peg.models.loading",
    "run_training": "detr_peg.engine.training",
    "run_evaluation": "detr_peg.engine.evaluation.run",
    "UserError": "detr_peg.errors",
}

# Config names import the models first: the architectures and encodings register the config fields.
__all__, __getattr__, __dir__ = _lazy_exports(
    __name__, _EXPORTS, eager=("__version__",), first={"detr_peg.config": "detr_peg.models"}
)
