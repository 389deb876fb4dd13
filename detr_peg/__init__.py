"""detr_peg: DETR and Deformable-DETR with CPVT's Positional Encoding Generator.

Public API::

    import detr_peg

    cfg = detr_peg.load_config("configs/detr_r50_peg.yaml", ["model.num_classes=91"])
    model = detr_peg.build_model(cfg)            # random init (or configured backbone weights)
    model = detr_peg.load_model("model.pth")     # a trained or converted checkpoint, eval mode
    out = model(images, mask)                    # Tensor[B, 3, H, W] + Tensor[B, H, W] (True = padding)
    out = model([img1, img2])                    # or a list of unpadded Tensor[3, H, W]
"""

from detr_peg.checkpoint.format import load_model
from detr_peg.config import Config, load_config
from detr_peg.models import build_criterion, build_model, build_postprocessor

__version__ = "0.1.0"

__all__ = [
    "Config",
    "__version__",
    "build_criterion",
    "build_model",
    "build_postprocessor",
    "load_config",
    "load_model",
]
