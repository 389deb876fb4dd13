"""Small feed-forward building blocks shared by the detectors."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.errors import ConfigError

# Only width-preserving activations: the feed-forward block maps d -> ff -> d, so a gated
# unit such as GLU (which halves its input) would need a 2*ff-wide first layer.
# ReLU overwrites its input: the feed-forward blocks apply it to the first linear layer's
# fresh output, which nothing else reads (its backward needs only the ReLU's result), and
# a new [B, S, ff] map per layer is a large allocation at detection resolutions.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": partial(F.relu, inplace=True), "gelu": F.gelu}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function called ``name`` (``relu`` or ``gelu``).

    The function may overwrite its argument (``relu`` runs in place): call it
    on a tensor that nothing else reads, such as a linear layer's output.
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        valid = ", ".join(repr(n) for n in ACTIVATIONS)
        raise ConfigError(f"Unknown activation {name!r}: valid are {valid}.") from None


class MLP(nn.Module):
    """A multi-layer perceptron with ReLU between layers (the box head of DETR).

    State-dict keys are ``layers.{i}.weight``/``layers.{i}.bias``, as in the
    official code.

    Args:
        input_dim: input width.
        hidden_dim: width of the hidden layers.
        output_dim: output width.
        num_layers: number of linear layers (>= 1).
    """

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
