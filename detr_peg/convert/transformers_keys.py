"""State-dict keys shared by Transformers' DETR and Deformable-DETR: backbone, positional encoding, attention.

Both file names (Transformers 4 layout) and Transformers 5 in-memory names are read.
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
    """A new dict with each ``{q,k,v}_proj`` triple stacked into ``in_proj_weight [3d, d]`` and ``in_proj_bias [3d]``.

    Rows are queries, keys, values (``nn.MultiheadAttention``'s order); ``CheckpointError`` for an incomplete triple.
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
