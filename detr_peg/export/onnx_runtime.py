"""Running an exported detector in ONNX Runtime with the PyTorch model's interface.

:class:`OnnxDetector` opens a file written by
:func:`~detr_peg.export.onnx_export.export_onnx` and is called like the
PyTorch detector: ``detector(images, mask)`` with a padded batch
``Tensor[B, 3, H, W]`` and its mask ``Tensor[B, H, W]`` (True = padding)
returns ``{"pred_logits", "pred_boxes"}`` as torch tensors. It carries the
``config``, ``label_map`` and ``size_divisibility`` stored in the file, so
:meth:`OnnxDetector.as_loaded_model` gives the one inference loop
(:func:`~detr_peg.engine.inference.run_inference`, used by
:meth:`detr_peg.Detector.from_onnx`) what it needs, the PyTorch
post-processor of the architecture included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from detr_peg.config.loader import config_from_dict, config_to_dict, load_config
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import CheckpointError
from detr_peg.export.export_options import require_onnx
from detr_peg.export.onnx_export import (
    METADATA_CONFIG,
    METADATA_LABEL_MAP,
    METADATA_SIZE_DIVISIBILITY,
)
from detr_peg.export.onnx_session import session_options
from detr_peg.fileio.file_locations import check_checkpoint_file
from detr_peg.models.builder import build_model, build_postprocessor
from detr_peg.models.loading import LoadedModel, without_backbone_weights


class OnnxDetector:
    """An exported detector in an ONNX Runtime session (CPU by default).

    Args:
        path: the ``.onnx`` file.
        overrides: ``key=value`` changes to the stored config that do not
            alter the graph (``data.val_scale=512``, ``eval.score_threshold=0.3``).
        providers: ONNX Runtime execution providers (default: CPU).
        threads: intra-op threads (default: ONNX Runtime's choice).
        graph_optimization: ONNX Runtime's graph optimization level, a key of
            :data:`~detr_peg.export.onnx_session.GRAPH_OPTIMIZATION_LEVELS`
            (default ``"all"``, ONNX Runtime's own); the other session options
            are those of :func:`~detr_peg.export.onnx_session.session_options`.

    Attributes:
        config: the stored config (with ``overrides``), or None when the file has none.
        label_map: the stored label map (plain dict) or None.
        input_names: the graph's inputs (``images``, ``mask`` and, for graphs
            exported with post-processing, ``orig_sizes``).

    Raises:
        UserError: the ONNX packages are missing, the file is missing or not
            a valid ONNX model, or ``graph_optimization`` is unknown.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overrides: Iterable[str] = (),
        providers: list[str] | None = None,
        threads: int | None = None,
        graph_optimization: str = "all",
    ) -> None:
        require_onnx()
        import onnxruntime as ort
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf, NoSuchFile

        self.path = Path(path)
        check_checkpoint_file(self.path, "ONNX model")
        options = session_options(threads, graph_optimization)
        try:
            self.session = ort.InferenceSession(
                str(self.path), options, providers=providers or ["CPUExecutionProvider"]
            )
        except (Fail, InvalidGraph, InvalidProtobuf, NoSuchFile) as exc:
            raise CheckpointError(f"{self.path} is not a valid ONNX model ({str(exc).splitlines()[0]}).") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.label_map = json.loads(meta.get(METADATA_LABEL_MAP, "null"))
        self._size_divisibility = meta.get(METADATA_SIZE_DIVISIBILITY)
        self.config = None
        if METADATA_CONFIG in meta:
            cfg = config_from_dict(json.loads(meta[METADATA_CONFIG]), source=f"config stored in {self.path}")
            if overrides:
                cfg = load_config(
                    None, list(overrides), base=config_to_dict(cfg), base_source=f"config stored in {self.path}"
                )
            self.config = cfg

    def run(self, images: Tensor, mask: Tensor, orig_sizes: Tensor | None = None) -> dict[str, Tensor]:
        """Run the graph; returns every output by name as a torch tensor on the CPU.

        Args:
            images: ``Tensor[B, 3, H, W]`` float32 padded batch.
            mask: ``Tensor[B, H, W]`` bool, True = padding.
            orig_sizes: ``Tensor[B, 2]`` (h, w), for graphs exported with post-processing.
        """
        feed = {"images": _numpy(images, np.float32), "mask": _numpy(mask, np.bool_)}
        if "orig_sizes" in self.input_names:
            if orig_sizes is None:
                raise ValueError(f"{self.path} was exported with post-processing and needs orig_sizes")
            feed["orig_sizes"] = _numpy(orig_sizes, np.int64)
        outputs = self.session.run(self.output_names, feed)
        return {name: torch.from_numpy(value) for name, value in zip(self.output_names, outputs)}

    def __call__(self, images: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Same contract as the PyTorch detector: ``{"pred_logits", "pred_boxes"}`` (no auxiliary outputs).

        For a graph exported with post-processing the original sizes are taken
        to be the unpadded sizes (the post-processed outputs are not returned).
        """
        orig_sizes = None
        if "orig_sizes" in self.input_names:
            orig_sizes = torch.stack([(~mask[:, :, 0]).sum(1), (~mask[:, 0, :]).sum(1)], 1)
        out = self.run(images, mask, orig_sizes)
        return {"pred_logits": out["pred_logits"].to(images.device), "pred_boxes": out["pred_boxes"].to(images.device)}

    @property
    def size_divisibility(self) -> int:
        """The coarsest stride of the exported model (batches are padded to a multiple of it).

        Read from the file; graphs exported before it was stored get it from
        a model built from the stored config (no weights are needed for it).
        """
        if self._size_divisibility is None:
            if self.config is None:
                raise CheckpointError(f"{self.path} holds no detr_peg config; export it with `detr-peg export`.")
            self._size_divisibility = str(build_model(without_backbone_weights(self.config)).size_divisibility)
        return int(self._size_divisibility)

    def as_loaded_model(self) -> LoadedModel:
        """This graph as a :class:`~detr_peg.models.loading.LoadedModel` (with the architecture's post-processor).

        Raises:
            CheckpointError: the file holds no detr_peg config.
        """
        if self.config is None:
            raise CheckpointError(f"{self.path} holds no detr_peg config; export it with `detr-peg export`.")
        label_map = LabelMap.from_dict(self.label_map) if self.label_map else None
        return LoadedModel(self, build_postprocessor(self.config), self.config, label_map)

    def eval(self) -> OnnxDetector:
        """For symmetry with ``nn.Module``: a graph is always in inference mode."""
        return self


def _numpy(tensor: Tensor, dtype) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().numpy().astype(dtype, copy=False))


@torch.no_grad()
def compare_with_pytorch(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    batch_size: int | None = None,
    image_size: tuple[int, int] | None = None,
) -> float:
    """Run an exported graph and the PyTorch model on the same random padded batch.

    The batch has ``batch_size`` images (2 when dynamic), the last one padded
    by a quarter in each direction; its size is ``image_size``, or when the
    size is dynamic one that differs from the traced example.

    Returns:
        The largest absolute difference of ``pred_logits`` and ``pred_boxes``.
    """
    from detr_peg.export.onnx_export import example_inputs

    detector = OnnxDetector(path)
    h, w = image_size or (160, 224)
    images, mask = example_inputs(batch_size or 2, (h, w), postprocess=False)
    expected = model.eval()(images, mask)
    got = detector(images, mask)
    return max(float((got[k] - expected[k]).abs().max()) for k in ("pred_logits", "pred_boxes"))
