"""Small feed-forward building blocks shared by the detectors."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.errors import ConfigError


def relu_reusing_input(x: Tensor) -> Tensor:
    """ReLU that overwrites ``x`` when no gradient flows through it (inference), else a new tensor.

    In training an in-place ReLU on the linear layer's output view would make the backward clone the map.
    """
    return F.relu(x, inplace=not x.requires_grad)


# Only width-preserving activations: the feed-forward block maps d -> ff -> d, so a gated
# unit such as GLU (which halves its input) would need a 2*ff-wide first layer.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": relu_reusing_input, "gelu": F.gelu}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation ``relu`` or ``gelu`` (else ConfigError); it may overwrite its argument."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        valid = ", ".join(repr(n) for n in ACTIVATIONS)
        raise ConfigError(f"Unknown activation {name!r}: valid are {valid}.") from None


class MLP(nn.Module):
    """An MLP with ReLU between ``num_layers`` linear layers (keys ``layers.{i}.*``, as officially)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        outs = [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, outs))

    def forward(self, x: Tensor) -> Tensor:
        """``Tensor[..., input_dim]`` -> ``Tensor[..., output_dim]``."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = F.relu(x)
        return x
