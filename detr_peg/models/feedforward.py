"""Small feed-forward building blocks shared by the detectors."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from detr_peg.errors import ConfigError


def relu_reusing_input(x: Tensor) -> Tensor:
    """ReLU that overwrites ``x`` when no gradient flows through it (inference), else a new tensor.

    At detection resolutions a feed-forward hidden map is a large allocation
    per layer ([B, S, ff]; 73 MB for Deformable-DETR-R50 at 800 x 1066), which
    inference can spare. In training the input is a view of the linear layer's
    output, and an in-place ReLU on a view would make the backward pass clone
    the whole map, so there it is the ordinary ReLU.
    """
    return F.relu(x, inplace=not x.requires_grad)


# Only width-preserving activations: the feed-forward block maps d -> ff -> d, so a gated
# unit such as GLU (which halves its input) would need a 2*ff-wide first layer.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": relu_reusing_input, "gelu": F.gelu}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function called ``name`` (``relu`` or ``gelu``).

    The function may overwrite its argument (``relu`` does in inference): call
    it on a tensor that nothing else reads, such as a linear layer's output.
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
