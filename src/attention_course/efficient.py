"""Making attention fast (chapter 11): one import for the tools that live in four modules.

- :mod:`attention_course.cost`: :func:`layer_macs`, :func:`kv_cache_bytes`, :func:`measure_peak_memory`.
- :mod:`attention_course.tiled`: :func:`online_softmax_update`, :func:`online_softmax`,
  :func:`tiled_attention_step`, :func:`tiled_attention` (with FlashAttention's memory-saving backward).
- :mod:`attention_course.kv_cache`: :class:`KVCache` (optionally rolling, for sliding windows).
- :mod:`attention_course.incremental`: :class:`DecodingCache`, :func:`cached_self_attention`,
  :func:`decoder_layer_step`, :func:`decode_step`, :func:`cached_greedy_decode`.

``from attention_course.efficient import ...`` keeps working for every name, as chapter 11 and its exercise
use it.
"""

from __future__ import annotations

from attention_course.cost import kv_cache_bytes, layer_macs, measure_peak_memory
from attention_course.incremental import (
    DecodingCache,
    cached_greedy_decode,
    cached_self_attention,
    decode_step,
    decoder_layer_step,
)
from attention_course.kv_cache import KVCache
from attention_course.tiled import (
    TiledAttentionFunction,
    online_softmax,
    online_softmax_update,
    tiled_attention,
    tiled_attention_step,
)

__all__ = [
    "DecodingCache",
    "KVCache",
    "TiledAttentionFunction",
    "cached_greedy_decode",
    "cached_self_attention",
    "decode_step",
    "decoder_layer_step",
    "kv_cache_bytes",
    "layer_macs",
    "measure_peak_memory",
    "online_softmax",
    "online_softmax_update",
    "tiled_attention",
    "tiled_attention_step",
]
