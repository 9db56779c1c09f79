"""Incremental decoding of the encoder–decoder Transformer with key–value caches (chapter 11).

Each decoder layer gets a :class:`~attention_course.layers.DecoderLayerCache`: the self-attention's
:class:`~attention_course.KVCache` and the cross-attention's keys and values of the encoder output, projected
once. The layers take the cache as an explicit argument (``DecoderLayer.forward(..., cache=...)``), so the
same code, residuals, dropouts and LayerNorms run with and without it; :func:`decode_step` feeds the newest
token(s) through the decoder, and :func:`cached_greedy_decode` equals
:func:`~attention_course.greedy_decode`, token for token, at a fraction of the work.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention_course.checks import check_decoding_args
from attention_course.kv_cache import KVCache
from attention_course.layers import DecoderLayer, DecoderLayerCache
from attention_course.masks import source_mask
from attention_course.multihead import MultiHeadAttention
from attention_course.transformer import Transformer

__all__ = ["DecodingCache", "cached_greedy_decode", "cached_self_attention", "decode_step", "decoder_layer_step"]


def _check_attention_input(attention: MultiHeadAttention, x: Tensor, name: str) -> None:
    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(f"attention must be an attention_course.MultiHeadAttention, got {type(attention).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != attention.d_model:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape (batch, length, d_model={attention.d_model}), got {shape}")


def cached_self_attention(attention: MultiHeadAttention, x: Tensor, cache: KVCache) -> Tensor:
    """Causal self-attention for new positions only, reusing the keys and values of earlier ones.

    ``attention(x, x, x, cache=cache)[0]``: the new positions' keys and values are projected once and
    appended to ``cache``; their queries attend to every cached position and, among the new ones, to those at
    or before themselves. Feeding a sequence through in pieces (a prompt, then one token at a time) gives the
    same outputs as ``attention(x_all, x_all, x_all, mask=causal_mask(L))`` on the whole sequence.

    Args:
        attention: the layer's :class:`~attention_course.MultiHeadAttention`.
        x: ``(B, t_new, d_model)`` the inputs at the new positions.
        cache: this layer's :class:`~attention_course.KVCache`, updated in place.

    Returns:
        ``(B, t_new, d_model)`` the attention outputs at the new positions.
    """
    _check_attention_input(attention, x, "x")
    return attention(x, x, x, cache=cache)[0]


class DecodingCache:
    """What incremental decoding keeps for a :class:`~attention_course.Transformer`'s decoder.

    Args:
        model: the Transformer.
        memory: ``(B, Ls, d_model)`` the encoder output, ``model.encode(src, src_mask)``.
        memory_mask: optional bool mask broadcastable to ``(B, H, 1, Ls)``, usually the source padding mask
            ``(B, 1, 1, Ls)``.

    Attributes:
        layers: one :class:`~attention_course.layers.DecoderLayerCache` per decoder layer (cross-attention
            keys and values projected here, once).
        self_attention: the layers' self-attention :class:`~attention_course.KVCache` objects, in order.
        cross_keys: the layers' ``(B, Hkv, Ls, d_head)`` cross-attention keys, in order.
        cross_values: the layers' cross-attention values, the same shape, in order.
        position: how many target positions have been decoded so far.
    """

    def __init__(self, model: Transformer, memory: Tensor, memory_mask: Tensor | None = None) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be an attention_course.Transformer, got {type(model).__name__}")
        layers = model.decoder.layers
        _check_attention_input(layers[0].cross_attention, memory, "memory")
        self.memory_mask = memory_mask
        self.position = 0
        self.layers = []
        for layer in layers:
            keys, values = layer.cross_attention.project_kv(memory, memory)  # (B, Hkv, Ls, d_head)
            self.layers.append(DecoderLayerCache(KVCache(), keys, values))

    @property
    def self_attention(self) -> list[KVCache]:
        return [layer.self_attention for layer in self.layers]

    @property
    def cross_keys(self) -> list[Tensor | None]:
        return [layer.cross_keys for layer in self.layers]

    @property
    def cross_values(self) -> list[Tensor | None]:
        return [layer.cross_values for layer in self.layers]


def decoder_layer_step(
    layer: DecoderLayer,
    x: Tensor,
    self_cache: KVCache,
    cross_keys: Tensor,
    cross_values: Tensor,
    memory_mask: Tensor | None = None,
) -> Tensor:
    """One :class:`~attention_course.DecoderLayer` on new positions only, with cached keys and values.

    ``layer(x, None, memory_mask=memory_mask, cache=DecoderLayerCache(self_cache, cross_keys, cross_values))``:
    the layer's own forward pass, its attention reading keys and values from the caches.

    Args:
        layer: the decoder layer.
        x: ``(B, t_new, d_model)`` inputs at the new positions.
        self_cache: this layer's self-attention :class:`~attention_course.KVCache` (updated in place).
        cross_keys, cross_values: ``(B, Hkv, Ls, d_head)`` this layer's projected encoder output.
        memory_mask: optional bool mask broadcastable to ``(B, H, t_new, Ls)``.

    Returns:
        ``(B, t_new, d_model)``.
    """
    if not isinstance(layer, DecoderLayer):
        raise TypeError(f"layer must be an attention_course.DecoderLayer, got {type(layer).__name__}")
    return layer(x, None, memory_mask=memory_mask, cache=DecoderLayerCache(self_cache, cross_keys, cross_values))


def decode_step(model: Transformer, tokens: Tensor, cache: DecodingCache) -> Tensor:
    """Run the decoder on the next target tokens only, using and extending ``cache``.

    Args:
        model: the Transformer.
        tokens: ``(B, t_new)`` the next target tokens (usually ``t_new = 1``), at positions
            ``cache.position .. cache.position + t_new - 1``.
        cache: the :class:`DecodingCache` built from this batch's encoder output; updated in place.

    Returns:
        ``(B, t_new, tgt_vocab_size)`` logits, equal to the last ``t_new`` rows of
        ``model.decode(all_tokens_so_far, memory, causal_mask(...), memory_mask)``.
    """
    x = model.embed_target(tokens, offset=cache.position)  # (B, t_new, d_model), positions continue
    for layer, layer_cache in zip(model.decoder.layers, cache.layers):
        x = layer(x, None, memory_mask=cache.memory_mask, cache=layer_cache)
    if model.decoder.norm is not None:
        x = model.decoder.norm(x)
    cache.position += tokens.size(1)
    return model.generator(x)  # (B, t_new, vocab)


@torch.no_grad()
def cached_greedy_decode(
    model: Transformer,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    src_mask: Tensor | None = None,
) -> Tensor:
    """Greedy decoding with a KV cache: each step runs the decoder on the one newest token only.

    Same arguments and result as :func:`attention_course.decoding.greedy_decode`, which re-runs the decoder on
    the whole prefix at every step; the tokens are identical, the work per step no longer grows with the
    prefix (except the attention over the cached keys, one dot product per earlier token).

    Args:
        model: the Transformer; call ``model.eval()`` first (dropout would make each step random).
        src: ``(B, Ls)`` source token ids.
        max_len: the most tokens to generate after bos (eos included).
        bos_id, eos_id: ids of the start and end tokens.
        pad_id: builds the source padding mask (when ``src_mask`` is None) and fills the positions after a
            sequence's eos. None: no source mask, and eos fills those positions.
        src_mask: an explicit source mask broadcastable to ``(B, H, 1, Ls)``, True = may attend.

    Returns:
        ``(B, T)`` token ids with ``T <= max_len + 1``, each row starting with ``bos_id``; decoding stops
        when every sequence has produced eos.
    """
    check_decoding_args(src, max_len, bos_id, eos_id)  # the same argument checks as greedy_decode
    src_mask = source_mask(src, pad_id, src_mask)  # (B, 1, 1, Ls) from pad_id, unless one is given
    fill = eos_id if pad_id is None else pad_id
    memory = model.encode(src, src_mask)  # (B, Ls, d_model), computed once
    cache = DecodingCache(model, memory, src_mask)  # cross-attention keys/values, projected once
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
    for _ in range(max_len):
        logits = decode_step(model, tokens[:, -1:], cache)  # (B, 1, vocab): only the newest token goes in
        next_token = logits[:, -1].argmax(dim=-1).masked_fill(finished, fill)  # (B,)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    return tokens
