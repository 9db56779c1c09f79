"""The Transformer's encoder and decoder layers (Vaswani et al. 2017, §3.1), post-norm or pre-norm.

Each sub-layer f (attention or feed-forward) is wrapped in a residual connection with dropout and a
normalisation (LayerNorm unless a :class:`~attention_course.ModelConfig` asks for RMSNorm), in one of two
orders:

    post-norm (the paper, norm_first=False):  x = LayerNorm(x + Dropout(f(x)))
    pre-norm  (norm_first=True):              x = x + Dropout(f(LayerNorm(x)))

The dropout placement and the ReLU feed-forward match ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer``, so :meth:`EncoderLayer.from_torch` and :meth:`DecoderLayer.from_torch` give
layers that compute the same function as PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_course.config import ModelConfig, resolve_config
from attention_course.feedforward import feed_forward_for
from attention_course.kv_cache import KVCache
from attention_course.multihead import MultiHeadAttention
from attention_course.normalization import Dropout, LayerNorm, norm_for

__all__ = ["DecoderLayer", "DecoderLayerCache", "EncoderLayer"]


@dataclass
class DecoderLayerCache:
    """What incremental decoding keeps for one :class:`DecoderLayer`.

    Attributes:
        self_attention: the :class:`~attention_course.KVCache` of its causal self-attention.
        cross_keys: ``(B, Hkv, Ls, d_head)`` the cross-attention's keys of the encoder output, projected
            at the first step and reused after (None before it).
        cross_values: ``(B, Hkv, Ls, d_head)`` its values, kept the same way.
    """

    self_attention: KVCache = field(default_factory=KVCache)
    cross_keys: Tensor | None = None
    cross_values: Tensor | None = None


def _check_torch_layer(module: nn.Module, expected: type) -> None:
    if not isinstance(module, expected):
        raise TypeError(f"expected an nn.{expected.__name__}, got {type(module).__name__}")
    activation = module.activation
    if not (activation is F.relu or isinstance(activation, nn.ReLU)):
        raise ValueError(f"only the ReLU activation is supported, got {activation}")
    if module.linear1.bias is None or module.norm1.bias is None:
        raise ValueError("only layers built with bias=True are supported")


def _copy_linear(target: nn.Linear, source: nn.Linear) -> None:
    target.weight.copy_(source.weight)
    target.bias.copy_(source.bias)


def _copy_norm(target: LayerNorm, source: nn.LayerNorm) -> None:
    target.weight.copy_(source.weight)
    target.bias.copy_(source.bias)
    target.eps = source.eps


class EncoderLayer(nn.Module):
    """Self-attention then a position-wise feed-forward network, each with residual, dropout and LayerNorm.

    Args:
        d_model: model width.
        num_heads: attention heads (must divide ``d_model``).
        d_ff: hidden width of the feed-forward network.
        dropout: probability for the attention weights, the feed-forward hidden layer and both residual
            branches (one value for all, as in PyTorch).
        norm_first: False for post-norm (the paper), True for pre-norm.
        config: a :class:`~attention_course.ModelConfig` with the layer's choices: the self-attention's
            options (``num_kv_heads`` for grouped-query attention, ``positions`` ``None``, ``"rotary"`` or
            ``"alibi"``; see :class:`~attention_course.MultiHeadAttention`), normalisation, feed-forward
            activation, biases.

    Attributes:
        self_attention_weights: the ``(B, H, L, L)`` attention weights of the last forward call (detached),
            for plotting attention maps; None before the first call.

    Shape: ``forward(x (B, L, d_model), mask, cache=None) -> (B, L, d_model)``; ``mask`` broadcastable to
    ``(B, H, L, L)``, True = may attend (typically a padding mask ``(B, 1, 1, L)``, or a causal mask in a
    decoder-only model). With a :class:`~attention_course.KVCache`, ``x`` holds only the new positions and the
    self-attention is causal over everything cached (incremental decoding of a decoder-only model).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        config = resolve_config(config)
        self.config = config
        self.norm_first = norm_first
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout=dropout, config=config)
        self.feed_forward = feed_forward_for(d_model, d_ff, dropout=dropout, config=config)
        self.norm1 = norm_for(d_model, config)
        self.norm2 = norm_for(d_model, config)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.self_attention_weights: Tensor | None = None

    def self_attention_block(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Self-attention branch, before the residual add: ``Dropout(MHA(x, x, x))``."""
        output, weights = self.self_attention(x, x, x, mask=mask, cache=cache)
        self.self_attention_weights = weights.detach()
        return self.dropout1(output)

    def feed_forward_block(self, x: Tensor) -> Tensor:
        """Feed-forward branch, before the residual add: ``Dropout(FFN(x))``."""
        return self.dropout2(self.feed_forward(x))

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """``x (B, L, d_model)`` -> ``(B, L, d_model)``; ``cache``: see the class docstring."""
        if self.norm_first:
            x = x + self.self_attention_block(self.norm1(x), mask, cache)
            x = x + self.feed_forward_block(self.norm2(x))
        else:
            x = self.norm1(x + self.self_attention_block(x, mask, cache))
            x = self.norm2(x + self.feed_forward_block(x))
        return x

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoderLayer) -> EncoderLayer:
        """An :class:`EncoderLayer` computing the same function as ``module`` (weights, dropout, eps copied).

        ``module`` must use the ReLU activation; ``batch_first`` may be either value, since only weights are
        copied (this class is always batch-first).
        """
        _check_torch_layer(module, nn.TransformerEncoderLayer)
        attention = MultiHeadAttention.from_torch(module.self_attn)
        new = cls(
            attention.d_model,
            attention.num_heads,
            module.linear1.out_features,
            dropout=module.dropout.p,
            norm_first=module.norm_first,
        ).to(device=module.linear1.weight.device, dtype=module.linear1.weight.dtype)
        new.self_attention = attention
        with torch.no_grad():
            _copy_linear(new.feed_forward.linear1, module.linear1)
            _copy_linear(new.feed_forward.linear2, module.linear2)
            _copy_norm(new.norm1, module.norm1)
            _copy_norm(new.norm2, module.norm2)
        new.train(module.training)
        return new


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, then a feed-forward network.

    Each of the three sub-layers has its own residual connection, dropout and LayerNorm. Arguments are those
    of :class:`EncoderLayer`.

    Attributes:
        self_attention_weights: ``(B, H, Lt, Lt)`` weights of the last call (detached), or None.
        cross_attention_weights: ``(B, H, Lt, Ls)`` weights of the last call (detached), or None: which source
            positions each target position looked at.

    Shape: ``forward(x (B, Lt, d_model), memory (B, Ls, d_model), self_mask, memory_mask) -> (B, Lt, d_model)``
    with ``self_mask`` broadcastable to ``(B, H, Lt, Lt)`` (causal, and padding of the target:
    ``(B, 1, Lt, Lt)`` or ``(Lt, Lt)``) and ``memory_mask`` broadcastable to ``(B, H, Lt, Ls)`` (usually the
    source padding mask ``(B, 1, 1, Ls)``). True = may attend.

    Incremental decoding passes ``cache=DecoderLayerCache()``: ``x`` then holds only the new target positions,
    the self-attention appends their keys and values to the cache and attends causally to all of them, and
    the cross-attention projects ``memory`` once, at the first step, and reuses its keys and values after.

    The config's ``num_kv_heads`` (grouped-query attention) applies to both attentions; its ``positions``
    (``"rotary"`` or ``"alibi"``) to the self-attention only: source and target positions are not on one axis.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        config = resolve_config(config)
        self.config = config
        self.norm_first = norm_first
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout=dropout, config=config)
        # Source and target positions are not on one axis: the cross-attention has no positions and no window.
        cross_config = config.replace(positions=None, window=None)
        self.cross_attention = MultiHeadAttention(d_model, num_heads, dropout=dropout, config=cross_config)
        self.feed_forward = feed_forward_for(d_model, d_ff, dropout=dropout, config=config)
        self.norm1 = norm_for(d_model, config)
        self.norm2 = norm_for(d_model, config)
        self.norm3 = norm_for(d_model, config)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.self_attention_weights: Tensor | None = None
        self.cross_attention_weights: Tensor | None = None

    def self_attention_block(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Masked self-attention branch, before the residual add: ``Dropout(MHA(x, x, x))``."""
        output, weights = self.self_attention(x, x, x, mask=mask, cache=cache)
        self.self_attention_weights = weights.detach()
        return self.dropout1(output)

    def cross_attention_block(
        self, x: Tensor, memory: Tensor | None, mask: Tensor | None = None, cache: DecoderLayerCache | None = None
    ) -> Tensor:
        """Cross-attention branch: queries from the decoder ``x``, keys and values from ``memory``.

        With a cache, the keys and values of ``memory`` are projected once and kept in it.
        """
        if cache is None:
            if memory is None:
                raise ValueError("memory (the encoder output) is needed unless a cache holds its keys and values")
            output, weights = self.cross_attention(x, memory, memory, mask=mask)
        else:
            if cache.cross_keys is None or cache.cross_values is None:
                if memory is None:
                    raise ValueError("memory is needed at the first cached step, to project its keys and values")
                cache.cross_keys, cache.cross_values = self.cross_attention.project_kv(memory, memory)
            output, weights = self.cross_attention.attend(x, cache.cross_keys, cache.cross_values, mask)
        self.cross_attention_weights = weights.detach()
        return self.dropout2(output)

    def feed_forward_block(self, x: Tensor) -> Tensor:
        """Feed-forward branch, before the residual add: ``Dropout(FFN(x))``."""
        return self.dropout3(self.feed_forward(x))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecoderLayerCache | None = None,
    ) -> Tensor:
        """``x (B, Lt, d_model)``, ``memory (B, Ls, d_model)`` -> ``(B, Lt, d_model)``.

        ``self_mask`` must be causal for training with teacher forcing; it is not added automatically.
        With ``cache`` (see the class docstring) ``self_mask`` may be None: the cached self-attention builds
        its causal mask, and ``memory`` may be None after the first step.
        """
        if cache is not None and not isinstance(cache, DecoderLayerCache):
            raise TypeError(f"cache must be an attention_course.DecoderLayerCache, got {type(cache).__name__}")
        self_cache = None if cache is None else cache.self_attention
        if self.norm_first:
            x = x + self.self_attention_block(self.norm1(x), self_mask, self_cache)
            x = x + self.cross_attention_block(self.norm2(x), memory, memory_mask, cache)
            return x + self.feed_forward_block(self.norm3(x))
        x = self.norm1(x + self.self_attention_block(x, self_mask, self_cache))
        x = self.norm2(x + self.cross_attention_block(x, memory, memory_mask, cache))
        return self.norm3(x + self.feed_forward_block(x))

    @classmethod
    def from_torch(cls, module: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A :class:`DecoderLayer` computing the same function as ``module`` (weights, dropout, eps copied).

        ``module`` must use the ReLU activation; ``batch_first`` may be either value.
        """
        _check_torch_layer(module, nn.TransformerDecoderLayer)
        self_attention = MultiHeadAttention.from_torch(module.self_attn)
        new = cls(
            self_attention.d_model,
            self_attention.num_heads,
            module.linear1.out_features,
            dropout=module.dropout.p,
            norm_first=module.norm_first,
        ).to(device=module.linear1.weight.device, dtype=module.linear1.weight.dtype)
        new.self_attention = self_attention
        new.cross_attention = MultiHeadAttention.from_torch(module.multihead_attn)
        with torch.no_grad():
            _copy_linear(new.feed_forward.linear1, module.linear1)
            _copy_linear(new.feed_forward.linear2, module.linear2)
            _copy_norm(new.norm1, module.norm1)
            _copy_norm(new.norm2, module.norm2)
            _copy_norm(new.norm3, module.norm3)
        new.train(module.training)
        return new
