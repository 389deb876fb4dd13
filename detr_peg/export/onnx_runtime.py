"""Running an exported detector in ONNX Runtime with the PyTorch model's interface (:class:`OnnxDetector`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from detr_peg.checkpoint.files import check_checkpoint_file
from detr_peg.config.loader import config_from_dict, config_to_dict, load_config, parse_overrides
from detr_peg.data.label_map import LabelMap
from detr_peg.errors import CheckpointError, ConfigError, DataError
from detr_peg.export.export_options import require_onnx
from detr_peg.export.onnx_export import (
    METADATA_CONFIG,
    METADATA_LABEL_MAP,
    METADATA_SIZE_DIVISIBILITY,
)
from detr_peg.export.onnx_session import session_options
from detr_peg.models.builder import build_model, build_postprocessor
from detr_peg.models.loading import LoadedModel, without_backbone_weights

#: onnxruntime's errors that mean the file cannot be loaded (empty, damaged, an operator it lacks, ...).
LOAD_ERRORS = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoModel", "NoSuchFile", "NotImplemented")


class OnnxDetector:
    """An exported detector in an ONNX Runtime session (CPU by default), carrying the file's config and label map.

    ``overrides``: config changes that do not alter the graph; ``graph_optimization``: a key of
    :data:`~detr_peg.export.onnx_session.GRAPH_OPTIMIZATION_LEVELS`. Raises ``UserError``: ONNX packages
    missing, file missing or invalid, unknown ``graph_optimization``.
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
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        self.path = Path(path)
        check_checkpoint_file(self.path, "ONNX model")
        options = session_options(threads, graph_optimization)
        try:
            self.session = ort.InferenceSession(
                str(self.path), options, providers=providers or ["CPUExecutionProvider"]
            )
        except tuple(getattr(ort_errors, name) for name in LOAD_ERRORS) as exc:  # the file's fault, not the code's
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise CheckpointError(f"{self.path} is not an ONNX model onnxruntime can load ({reason}).") from None
        self._run_errors = (ort_errors.Fail, ort_errors.RuntimeException, ort_errors.InvalidArgument)
        meta = self.session.get_modelmeta().custom_metadata_map
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.label_map = json.loads(meta.get(METADATA_LABEL_MAP, "null"))
        self._size_divisibility = meta.get(METADATA_SIZE_DIVISIBILITY)
        self.config = None
        if METADATA_CONFIG in meta:
            cfg = config_from_dict(json.loads(meta[METADATA_CONFIG]), source=f"config stored in {self.path}")
            overrides = list(overrides)
            fixed = [key for key in parse_overrides(overrides, "overrides") if key.startswith("model.")]
            if fixed:
                raise ConfigError(f"{fixed[0]} cannot be overridden: the ONNX graph {self.path} fixes the model "
                                  "(overrides of data.* and eval.* apply).")  # fmt: skip
            if overrides:
                cfg = load_config(
                    None, overrides, base=config_to_dict(cfg), base_source=f"config stored in {self.path}"
                )
            self.config = cfg

    def run(self, images: Tensor, mask: Tensor, orig_sizes: Tensor | None = None) -> dict[str, Tensor]:
        """Every output by name as a CPU tensor; ``images [B, 3, H, W]``, ``mask [B, H, W]`` (True = padding).

        A graph exported for a fixed image size gets its images' content padded (or its padding cut) to that size;
        one of a fixed batch size gets its batches cut to it and the last filled with copies (their outputs dropped).
        """
        fixed = self.session.get_inputs()[self.input_names.index("images")].shape  # ints where the export fixed them
        if isinstance(fixed[0], int) and images.shape[0] != fixed[0]:
            parts = []
            for start in range(0, images.shape[0], fixed[0]):
                given = [t[start : start + fixed[0]] for t in (images, mask, orig_sizes) if t is not None]
                filled = [torch.cat([t, t[-1:].expand(fixed[0] - len(t), *t.shape[1:])]) for t in given]
                parts.append({k: v[: len(given[0])] for k, v in self.run(*filled).items()})
            return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        for dim, want in ((-2, fixed[2]), (-1, fixed[3])):  # to a fixed size: pad, or cut off padding (not content)
            have = images.shape[dim]
            if isinstance(want, int) and have > want and mask.narrow(dim, want, have - want).all():
                images, mask = images.narrow(dim, 0, want), mask.narrow(dim, 0, want)
            elif isinstance(want, int) and have < want:
                pad = (0, want - have) if dim == -1 else (0, 0, 0, want - have)
                images, mask = F.pad(images, pad), F.pad(mask, pad, value=True)
        feed = {"images": _numpy(images, np.float32), "mask": _numpy(mask, np.bool_)}
        if "orig_sizes" in self.input_names:
            if orig_sizes is None:
                raise ValueError(f"{self.path} was exported with post-processing and needs orig_sizes")
            feed["orig_sizes"] = _numpy(orig_sizes, np.int64)
        if any(isinstance(want, int) and want != got for want, got in zip(fixed, feed["images"].shape)):
            raise DataError(
                f"{self.path} was exported for image batches of shape {fixed}, not {list(feed['images'].shape)}; "
                "export without --image-size for any size, or resize images to fit (data.val_scale, data.val_max_size)."
            )
        try:
            outputs = self.session.run(self.output_names, feed)
        except self._run_errors as exc:
            reason = " ".join(str(exc).split())[:200]
            learned = self.config is not None and self.config.model.position.name == "learned"
            hint = ("; its learned position tables take images up to their size: lower data.val_scale/val_max_size"
                    if learned else "")  # fmt: skip
            raise DataError(
                f"{self.path} failed on a batch of shape {list(feed['images'].shape)} (onnxruntime: {reason}){hint}."
            ) from None
        return {name: torch.from_numpy(value) for name, value in zip(self.output_names, outputs)}

    def __call__(self, images: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """``{"pred_logits", "pred_boxes"}`` as the PyTorch detector returns (no auxiliary outputs)."""
        orig_sizes = None
        if "orig_sizes" in self.input_names:
            orig_sizes = torch.stack([(~mask[:, :, 0]).sum(1), (~mask[:, 0, :]).sum(1)], 1)
        out = self.run(images, mask, orig_sizes)
        return {"pred_logits": out["pred_logits"].to(images.device), "pred_boxes": out["pred_boxes"].to(images.device)}

    @property
    def size_divisibility(self) -> int:
        """The coarsest stride of the exported model (read from the file, else from a model built from its config)."""
        if self._size_divisibility is None:
            if self.config is None:
                raise CheckpointError(f"{self.path} holds no detr_peg config; export it with `detr-peg export`.")
            self._size_divisibility = str(build_model(without_backbone_weights(self.config)).size_divisibility)
        return int(self._size_divisibility)

    def as_loaded_model(self) -> LoadedModel:
        """This graph as a ``LoadedModel`` with its post-processor; ``CheckpointError`` when it holds no config."""
        if self.config is None:
            raise CheckpointError(f"{self.path} holds no detr_peg config; export it with `detr-peg export`.")
        label_map = LabelMap.from_dict(self.label_map) if self.label_map else None
        return LoadedModel(self, build_postprocessor(self.config), self.config, label_map)

    def eval(self) -> OnnxDetector:
        """For symmetry with ``nn.Module``: a graph is always in inference mode."""
        return self

    def to(self, device: str | torch.device) -> OnnxDetector:
        """For symmetry with ``nn.Module``: ONNX Runtime runs the graph on the CPU (``evaluate`` moves models)."""
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
    """Largest absolute difference of ``pred_logits`` and ``pred_boxes``, graph vs. model, on a random padded batch."""
    from detr_peg.export.onnx_export import TRACE_SIZE, example_inputs

    detector = OnnxDetector(path)
    h, w = image_size or TRACE_SIZE[::-1]  # not the traced size, yet within what the model took (learned tables)
    images, mask = example_inputs(batch_size or 2, (h, w), postprocess=False)
    expected = model.eval()(images, mask)
    got = detector(images, mask)
    return max(float((got[k] - expected[k]).abs().max()) for k in ("pred_logits", "pred_boxes"))
