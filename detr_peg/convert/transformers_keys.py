"""The state-dict keys that Transformers' DETR and Deformable-DETR share: backbone, positional encoding, attention.

The keys are those of the files, as every Transformers version writes them
(``save_pretrained`` of Transformers 5 writes the names of Transformers 4:
``backbone.conv_encoder``, ``out_proj``, ``fc1``); the names Transformers 5
uses in memory (``backbone.model``, ``o_proj``, ``mlp.fc1``) are read too.

* **Backbone.** A timm model (``use_timm_backbone``, the layout of the
  published DETR checkpoints) sits under ``model.backbone.conv_encoder.model.``
  with timm's names, which for a plain ResNet are torchvision's
  (``conv1``, ``bn1``, ``layer1.0.conv1`` ...): it becomes ``backbone.body.*``.
  Transformers' own ResNet (``ResNetBackbone``) names its stem
  ``embedder.embedder.{convolution,normalization}`` and its blocks
  ``encoder.stages.{s}.layers.{b}.layer.{j}`` and ``...shortcut``: stage ``s``
  is torchvision's ``layer{s+1}``, convolution ``j`` is ``conv{j+1}`` with
  ``bn{j+1}``, and the shortcut is ``downsample.0/1``.
* **Positional encoding.** The learned tables ``row_embeddings`` and
  ``column_embeddings`` (under ``model.position_embedding``, or
  ``model.backbone.position_embedding`` in Transformers 4) become
  ``transformer.position.row_embed`` and ``col_embed``.
* **Attention.** Transformers projects queries, keys and values with three
  linear layers (``q_proj``, ``k_proj``, ``v_proj``); detr_peg, like the
  official code, keeps ``nn.MultiheadAttention``'s single ``in_proj_weight``
  ``[3d, d]`` (rows: queries, keys, values) and ``in_proj_bias``, so the three
  are stacked in that order (:func:`fuse_attention_projections`).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from detr_peg.errors import CheckpointError

#: Where the backbone's modules sit in the file (Transformers 4 and 5) and in memory (Transformers 5).
BACKBONE = r"model\.backbone\.(?:conv_encoder\.)?model\."

#: Transformers' ResNet (``ResNetBackbone``) -> torchvision's ResNet names, stage by stage and convolution by convolution.
RESNET_RULES: list[tuple[str, str | None]] = [
    (BACKBONE + r"embedder\.embedder\.convolution\.(.*)", r"backbone.body.conv1.\1"),
    (BACKBONE + r"embedder\.embedder\.normalization\.(.*)", r"backbone.body.bn1.\1"),
    *[
        rule
        for stage in range(4)
        for rule in (
            (
                BACKBONE + rf"encoder\.stages\.{stage}\.layers\.(\d+)\.shortcut\.convolution\.(.*)",
                rf"backbone.body.layer{stage + 1}.\1.downsample.0.\2",
            ),
            (
                BACKBONE + rf"encoder\.stages\.{stage}\.layers\.(\d+)\.shortcut\.normalization\.(.*)",
                rf"backbone.body.layer{stage + 1}.\1.downsample.1.\2",
            ),
            *[
                (
                    BACKBONE + rf"encoder\.stages\.{stage}\.layers\.(\d+)\.layer\.{conv}\.{part}\.(.*)",
                    rf"backbone.body.layer{stage + 1}.\1.{name}{conv + 1}.\2",
                )
                for conv in range(3)
                for part, name in (("convolution", "conv"), ("normalization", "bn"))
            ],
        )
    ],
]

#: A timm backbone keeps timm's names (torchvision's for a plain ResNet).
TIMM_RULES: list[tuple[str, str | None]] = [(BACKBONE + r"(.*)", r"backbone.body.\1")]

POSITION_RULES: list[tuple[str, str | None]] = [
    (r"model\.(?:backbone\.)?position_embedding\.row_embeddings\.weight", "transformer.position.row_embed.weight"),
    (r"model\.(?:backbone\.)?position_embedding\.column_embeddings\.weight", "transformer.position.col_embed.weight"),
]

#: Where the learned encoding's row table is (Transformers 5, Transformers 4): its rows size ``model.position.num_embeddings``.
ROW_TABLES = (
    "model.position_embedding.row_embeddings.weight",
    "model.backbone.position_embedding.row_embeddings.weight",
)

#: The output projection of an attention module: ``out_proj`` in the files, ``o_proj`` in Transformers 5's memory.
OUT_PROJ = r"(?:out_proj|o_proj)"
#: The feed-forward layers: ``fc1``/``fc2`` in the files, ``mlp.fc1``/``mlp.fc2`` in Transformers 5's memory.
FC = r"(?:mlp\.)?fc"

_PROJECTION = re.compile(r"(?P<module>.*)\.(?P<which>[qkv])_proj\.(?P<param>weight|bias)")


def is_resnet_layout(state: dict[str, Tensor]) -> bool:
    """Whether the backbone is Transformers' own ResNet (``embedder``/``encoder.stages``), not a timm model."""
    pattern = re.compile(BACKBONE + r"embedder\.embedder\.convolution\.weight")
    return any(pattern.fullmatch(key) for key in state)


def fuse_attention_projections(state: dict[str, Tensor], src: str) -> dict[str, Tensor]:
    """``state`` with every ``{q,k,v}_proj.{weight,bias}`` triple stacked into ``in_proj_{weight,bias}``.

    Args:
        state: a Transformers state dict (``...self_attn.q_proj.weight``: ``Tensor[d, d]``).
        src: the source, for messages.

    Returns:
        A new dict: ``...self_attn.in_proj_weight`` (``Tensor[3d, d]``, rows
        queries, keys, values) and ``...self_attn.in_proj_bias`` (``Tensor[3d]``)
        instead of the three projections; other keys unchanged.

    Raises:
        CheckpointError: a projection without its two partners.
    """
    groups: dict[tuple[str, str], dict[str, Tensor]] = {}
    fused: dict[str, Tensor] = {}
    for key, value in state.items():
        match = _PROJECTION.fullmatch(key)
        if match is None:
            fused[key] = value
            continue
        groups.setdefault((match["module"], match["param"]), {})[match["which"]] = value
    for (module, param), parts in groups.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(
                f"{src}: '{module}' has the {'/'.join(sorted(parts))} projection {param} but not all of q, k and v."
            )
        fused[f"{module}.in_proj_{param}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return fused
