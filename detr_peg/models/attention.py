"""Multi-head attention on ``scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.models.dropout import cpu_mask_applies, dropout


class MultiheadAttention(nn.Module):
    """Batch-first multi-head attention with the parameters of ``nn.MultiheadAttention``.

    The parameters and state-dict keys are those of ``nn.MultiheadAttention``
    (``in_proj_weight`` ``[3d, d]`` with q, k, v stacked, ``in_proj_bias``,
    ``out_proj.weight``, ``out_proj.bias``), so official DETR weights load
    unchanged. The attention itself runs in
    ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels where
    available), and inputs that are the same tensor share one projection
    matmul (``q is k``, or ``q is k is v`` when no positional encoding is added).
    Where the dropout draws the cheaper CPU mask
    (:func:`~detr_peg.models.dropout.cpu_mask_applies`: eager CPU training),
    ``scaled_dot_product_attention`` would fall back to its unfused path and
    draw a Bernoulli sample per attention weight; there the same steps are
    written out (scaled scores, masked softmax, that dropout, weighted sum).

    Args:
        embed_dim: model width ``d``.
        num_heads: heads; ``d`` must be divisible by it.
        dropout: dropout on the attention weights (training only).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initialisation of ``nn.MultiheadAttention``."""
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)
        nn.init.zeros_(self.out_proj.bias)

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d = self.embed_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key:
            if key is value:
                return F.linear(query, w, b).chunk(3, dim=-1)
            q, k = F.linear(query, w[: 2 * d], b[: 2 * d]).chunk(2, dim=-1)
            return q, k, F.linear(value, w[2 * d :], b[2 * d :])
        return (
            F.linear(query, w[:d], b[:d]),
            F.linear(key, w[d : 2 * d], b[d : 2 * d]),
            F.linear(value, w[2 * d :], b[2 * d :]),
        )

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``Tensor[B, Lq, d]``.
            key: ``Tensor[B, Lk, d]``.
            value: ``Tensor[B, Lk, d]``.
            key_padding_mask: ``Tensor[B, Lk]`` bool, True = padding (ignored key).

        Returns:
            ``Tensor[B, Lq, d]``.
        """
        b, lq, d = query.shape
        lk = key.shape[1]
        h = self.num_heads
        q, k, v = self._project(query, key, value)
        q = q.reshape(b, lq, h, d // h).transpose(1, 2)
        k = k.reshape(b, lk, h, d // h).transpose(1, 2)
        v = v.reshape(b, lk, h, d // h).transpose(1, 2)
        if cpu_mask_applies(q, self.dropout, self.training):
            out = attention_with_dropout(q, k, v, key_padding_mask, self.dropout)
        else:
            attn_mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
            p = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.out_proj(out.transpose(1, 2).reshape(b, lq, d))


def attention_with_dropout(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, p: float) -> Tensor:
    """``softmax(q k^T / sqrt(head_dim))``, masked, with dropout on the weights, times ``v``.

    What ``scaled_dot_product_attention`` computes with ``dropout_p=p``, with
    the dropout mask of :func:`~detr_peg.models.dropout.dropout`. The softmax
    runs in float32 at least (as the fused kernels do under autocast), and a
    query whose keys are all padding gets zero weights, as in
    ``scaled_dot_product_attention``.

    Args:
        q: ``Tensor[B, h, Lq, head_dim]``.
        k: ``Tensor[B, h, Lk, head_dim]``.
        v: ``Tensor[B, h, Lk, head_dim]``.
        key_padding_mask: ``Tensor[B, Lk]`` bool, True = padding (ignored key), or None.
        p: dropout probability on the attention weights.

    Returns:
        ``Tensor[B, h, Lq, head_dim]``.
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))  # [B, h, Lq, Lk]
    softmax = torch.softmax
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        if bool(key_padding_mask.all(-1).any()):
            softmax = torch.ops.aten._safe_softmax  # zeros, not NaN, for rows with no key (as SDPA)
    weights = softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32))
    return torch.matmul(dropout(weights, p).to(v.dtype), v)
