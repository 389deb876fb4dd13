"""The DETR encoder-decoder transformer (the official one: post-norm by default, decoder norm on every
layer's output), batch-first ``[B, N, C]``, with a pluggable positional encoding that may add
``pos`` to queries and keys and mix tokens between encoder layers.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from detr_peg.models.attention import MultiheadAttention
from detr_peg.models.dropout import Dropout
from detr_peg.models.feedforward import get_activation
from detr_peg.models.position.base import PositionalEncoding


def with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    """``x + pos``, or ``x`` itself when there is no positional encoding."""
    return x if pos is None else x + pos


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward block (post-norm unless ``pre_norm``)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        dropout: float,
        activation: str = "relu",
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = get_activation(activation)
        self.pre_norm = pre_norm

    def _ffn(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(self, src: Tensor, key_padding_mask: Tensor | None, pos: Tensor | None) -> Tensor:
        """``src``: ``Tensor[B, N, C]``; mask ``Tensor[B, N]`` True = padding; pos like src or None."""
        if self.pre_norm:
            x = self.norm1(src)
            q = with_pos(x, pos)
            src = src + self.dropout1(self.self_attn(q, q, x, key_padding_mask))
            return src + self.dropout2(self._ffn(self.norm2(src)))
        q = with_pos(src, pos)
        src = self.norm1(src + self.dropout1(self.self_attn(q, q, src, key_padding_mask)))
        return self.norm2(src + self.dropout2(self._ffn(src)))


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention and feed-forward block.

    ``cross_attn`` is the official ``multihead_attn``.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        dropout: float,
        activation: str = "relu",
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.cross_attn = MultiheadAttention(d_model, nhead, dropout=dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = get_activation(activation)
        self.pre_norm = pre_norm

    def _ffn(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self, tgt: Tensor, memory: Tensor, memory_key: Tensor, memory_key_padding_mask: Tensor | None, query_pos: Tensor
    ) -> Tensor:
        """``tgt``, ``query_pos`` ``[B, Q, C]``; values ``memory`` ``[B, N, C]``, keys ``memory_key`` (memory + pos)."""
        if self.pre_norm:
            x = self.norm1(tgt)
            q = x + query_pos
            tgt = tgt + self.dropout1(self.self_attn(q, q, x))
            x = self.norm2(tgt)
            tgt = tgt + self.dropout2(self.cross_attn(x + query_pos, memory_key, memory, memory_key_padding_mask))
            return tgt + self.dropout3(self._ffn(self.norm3(tgt)))
        q = tgt + query_pos
        tgt = self.norm1(tgt + self.dropout1(self.self_attn(q, q, tgt)))
        tgt2 = self.cross_attn(tgt + query_pos, memory_key, memory, memory_key_padding_mask)
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt)))


class Encoder(nn.Module):
    """A stack of encoder layers; the positional encoding may mix tokens between them."""

    def __init__(self, layer: EncoderLayer, num_layers: int, norm: nn.LayerNorm | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = norm

    def forward(
        self,
        src: Tensor,
        key_padding_mask: Tensor,
        pos: Tensor | None,
        position: PositionalEncoding,
        spatial_shapes: list[tuple[int, int]],
    ) -> Tensor:
        """``src`` ``Tensor[B, N, C]`` -> memory ``Tensor[B, N, C]``."""
        if position.mixes_after(-1):
            src = position.mix(-1, src, key_padding_mask, spatial_shapes)
        for i, layer in enumerate(self.layers):
            src = layer(src, key_padding_mask, pos)
            if position.mixes_after(i):
                src = position.mix(i, src, key_padding_mask, spatial_shapes)
        return src if self.norm is None else self.norm(src)


class Decoder(nn.Module):
    """A stack of decoder layers returning every layer's normalised output."""

    def __init__(self, layer: DecoderLayer, num_layers: int, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = norm

    def forward(
        self, tgt: Tensor, memory: Tensor, memory_key: Tensor, memory_key_padding_mask: Tensor, query_pos: Tensor
    ) -> Tensor:
        """Returns ``Tensor[L, B, Q, C]``, the normalised output of each of the ``L`` layers."""
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, memory, memory_key, memory_key_padding_mask, query_pos)
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)


class Transformer(nn.Module):
    """DETR's encoder-decoder on one feature level."""

    def __init__(self, *, encoder: Encoder, decoder: Decoder, position: PositionalEncoding, d_model: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.position = position
        self.d_model = d_model
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # The official initialisation: Xavier on every matrix of the encoder and
        # decoder. The positional encoding keeps its own initialisation (in the
        # official code it lives in the backbone, outside this reset).
        for module in (self.encoder, self.decoder):
            for p in module.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def forward(self, src: Tensor, mask: Tensor, query_embed: Tensor) -> tuple[Tensor, Tensor]:
        """Encode a feature map and decode the queries.

        ``src`` ``[B, C, H, W]``; ``mask`` ``[B, H, W]`` bool, True = padding; ``query_embed`` ``[Q, C]``.
        Returns ``(hs, memory)``: ``hs`` ``[L, B, Q, C]`` (each decoder layer, normalised), ``memory`` ``[B, C, H, W]``.
        """
        b, c, h, w = src.shape
        pos = self.position(mask)
        tokens = src.flatten(2).transpose(1, 2)
        pos_seq = None if pos is None else pos.to(src.dtype).flatten(2).transpose(1, 2)
        mask_seq = mask.flatten(1)
        memory = self.encoder(tokens, mask_seq, pos_seq, self.position, [(h, w)])
        query_pos = query_embed.unsqueeze(0).expand(b, -1, -1)
        tgt = torch.zeros_like(query_pos)
        hs = self.decoder(tgt, memory, with_pos(memory, pos_seq), mask_seq, query_pos)
        return hs, memory.transpose(1, 2).reshape(b, c, h, w)
