"""The feed-forward activations: ReLU reuses its input in inference only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from detr_peg.errors import ConfigError
from detr_peg.models.feedforward import get_activation


def test_relu_overwrites_its_input_without_gradient() -> None:
    relu = get_activation("relu")
    x = torch.randn(3, 5, 16)
    expected = x.clamp(min=0)
    with torch.no_grad():
        y = relu(x)
    assert y.data_ptr() == x.data_ptr()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_relu_in_training_is_a_new_tensor_with_its_own_backward() -> None:
    """In place on a linear layer's (view) output, the backward would clone the whole map (CopySlices)."""
    torch.manual_seed(0)
    relu = get_activation("relu")
    linear = nn.Linear(8, 16)
    x = torch.randn(2, 3, 8)
    h = linear(x)
    y = relu(h)
    assert y.data_ptr() != h.data_ptr() and type(y.grad_fn).__name__ == "ReluBackward0"
    grad = torch.randn_like(y)
    y.backward(grad)
    reference = nn.Linear(8, 16)
    reference.load_state_dict(linear.state_dict())
    torch.relu(reference(x)).backward(grad)
    torch.testing.assert_close(linear.weight.grad, reference.weight.grad, rtol=0, atol=0)
    torch.testing.assert_close(linear.bias.grad, reference.bias.grad, rtol=0, atol=0)


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ConfigError, match="Unknown activation 'glu': valid are 'relu', 'gelu'"):
        get_activation("glu")
