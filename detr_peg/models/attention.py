"""Multi-head attention on ``scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.models.dropout import cpu_mask_applies, dropout


class MultiheadAttention(nn.Module):
    """Batch-first multi-head attention with the parameters and state-dict keys of ``nn.MultiheadAttention``.

    Official DETR weights load unchanged (``in_proj_weight`` ``[3d, d]`` q, k, v stacked). Runs in
    ``scaled_dot_product_attention``, except in eager CPU training with dropout, where the steps are
    written out so the weights get the cheaper CPU dropout mask. Raises ValueError if ``num_heads``
    does not divide ``embed_dim``.
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
        """``[B, Lq, d]`` queries to ``[B, Lk, d]`` keys/values -> ``[B, Lq, d]``; ``key_padding_mask`` True = skip."""
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
    """``scaled_dot_product_attention`` with ``dropout_p=p`` written out, with our :func:`dropout`.

    ``q``/``k``/``v`` ``[B, h, L, head_dim]``; ``key_padding_mask`` ``[B, Lk]`` bool, True = padding. The
    softmax runs in at least float32 and a query with only padded keys gets zero weights, as in SDPA.
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))  # [B, h, Lq, Lk]
    softmax = torch.softmax
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        if bool(key_padding_mask.all(-1).any()):
            softmax = torch.ops.aten._safe_softmax  # zeros, not NaN, for rows with no key (as SDPA)
    weights = softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32))
    return torch.matmul(dropout(weights, p).to(v.dtype), v)
