"""Multi-head attention: the written-out CPU training path against the fused one and its own formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detr_peg.models.attention import MultiheadAttention, attention_with_dropout
from detr_peg.models.dropout import keep_mask


def heads(seed: int, lq: int = 6, lk: int = 9, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 8, generator=g, dtype=dtype) for n in (lq, lk, lk))


def padding(lk: int = 9) -> torch.Tensor:
    mask = torch.zeros(2, lk, dtype=torch.bool)
    mask[1, 5:] = True
    return mask


@pytest.mark.parametrize("with_mask", [False, True])
def test_without_dropout_it_is_scaled_dot_product_attention(with_mask: bool) -> None:
    q, k, v = heads(0)
    mask = padding() if with_mask else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else ~mask[:, None, None, :])
    torch.testing.assert_close(attention_with_dropout(q, k, v, mask, 0.0), expected)


def test_dropout_output_and_gradients_follow_the_formula_with_the_same_mask() -> None:
    q, k, v = (t.requires_grad_(True) for t in heads(1))
    mask = padding()
    torch.manual_seed(3)
    out = attention_with_dropout(q, k, v, mask, 0.25)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, (q, k, v), upstream)

    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    scores = (q2 @ k2.transpose(-2, -1)) / 8**0.5
    weights = scores.masked_fill(mask[:, None, None, :], float("-inf")).softmax(-1)
    torch.manual_seed(3)
    keep, scale = keep_mask(weights.shape, 0.25)
    expected = (weights * keep * scale) @ v2
    torch.testing.assert_close(out, expected)
    for grad, grad_expected in zip(grads, torch.autograd.grad(expected, (q2, k2, v2), upstream)):
        torch.testing.assert_close(grad, grad_expected)
    assert not keep.all() and keep.any()


def test_a_query_with_only_padded_keys_gets_zeros_as_in_scaled_dot_product_attention() -> None:
    q, k, v = heads(4)
    mask = padding()
    mask[0] = True
    out = attention_with_dropout(q, k, v, mask, 0.1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], torch.zeros_like(out[0]), rtol=0, atol=0)


def test_bfloat16_inputs_keep_their_dtype_with_a_float32_softmax() -> None:
    q, k, v = heads(5, dtype=torch.float32)
    torch.manual_seed(0)
    out = attention_with_dropout(*(t.bfloat16() for t in (q, k, v)), padding(), 0.1)
    torch.manual_seed(0)
    reference = attention_with_dropout(q, k, v, padding(), 0.1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, rtol=0.05, atol=0.05)


def test_the_module_uses_it_in_cpu_training_and_the_fused_kernel_otherwise() -> None:
    torch.manual_seed(0)
    module = MultiheadAttention(32, 4, dropout=0.2).double()
    g = torch.Generator().manual_seed(6)
    query, key = (
        torch.randn(2, 6, 32, generator=g, dtype=torch.float64),
        torch.randn(2, 9, 32, generator=g, dtype=torch.float64),
    )
    mask = padding()

    def projected(x, w, b):
        return F.linear(x, w, b).reshape(x.shape[0], x.shape[1], 4, 8).transpose(1, 2)

    w, b = module.in_proj_weight, module.in_proj_bias
    q, k, v = projected(query, w[:32], b[:32]), projected(key, w[32:64], b[32:64]), projected(key, w[64:], b[64:])

    def merged(out):
        return module.out_proj(out.transpose(1, 2).reshape(2, 6, 32))

    module.train()
    torch.manual_seed(9)
    trained = module(query, key, key, key_padding_mask=mask)
    torch.manual_seed(9)
    torch.testing.assert_close(trained, merged(attention_with_dropout(q, k, v, mask, 0.2)))

    module.eval()
    evaluated = module(query, key, key, key_padding_mask=mask)
    torch.testing.assert_close(
        evaluated, merged(F.scaled_dot_product_attention(q, k, v, attn_mask=~mask[:, None, None, :]))
    )
    assert not torch.allclose(trained, evaluated)
