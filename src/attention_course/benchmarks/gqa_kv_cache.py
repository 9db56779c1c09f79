"""KV-cache bytes of multi-head, grouped-query and multi-query attention at one configuration.

A decoder-only stack of the library's layers (:class:`~attention_course.EncoderLayer` with a causal cache,
``num_kv_heads`` = 8, 2 and 1 for 8 query heads) processes a prompt of ``length`` tokens with a
:class:`~attention_course.KVCache` per layer. The figure is the bytes the caches hold afterwards, measured
from the tensors (``nbytes``), next to :func:`~attention_course.kv_cache_bytes`'s formula
``2 · layers · kv_heads · d_head · length · batch · bytes``; both must agree.
"""

from __future__ import annotations

import torch

from attention_course.config import ModelConfig
from attention_course.cost import kv_cache_bytes
from attention_course.kv_cache import KVCache
from attention_course.layers import EncoderLayer

CONFIG = {"layers": 4, "d_model": 256, "num_heads": 8, "d_ff": 512, "length": 512, "batch": 2,
          "dtype": "float32", "threads": 1}
VARIANTS = {"mha": 8, "gqa": 2, "mqa": 1}


def run() -> dict:
    """Return ``{variant: {"num_kv_heads", "measured_bytes", "formula_bytes", "ratio_to_mha"}, "config"}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    results: dict = {}
    try:
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randn(CONFIG["batch"], CONFIG["length"], CONFIG["d_model"], generator=generator)
        for name, kv_heads in VARIANTS.items():
            torch.manual_seed(0)
            config = ModelConfig(num_kv_heads=kv_heads)
            layers = [EncoderLayer(CONFIG["d_model"], CONFIG["num_heads"], CONFIG["d_ff"], dropout=0.0,
                                   norm_first=True, config=config).eval() for _ in range(CONFIG["layers"])]
            caches = [KVCache() for _ in layers]
            with torch.no_grad():
                x = prompt
                for layer, cache in zip(layers, caches):
                    x = layer(x, cache=cache)
            measured = sum(cache.keys.nbytes + cache.values.nbytes for cache in caches)
            formula = kv_cache_bytes(CONFIG["layers"], kv_heads, CONFIG["d_model"] // CONFIG["num_heads"],
                                     CONFIG["length"], batch=CONFIG["batch"], bytes_per_value=4)
            if measured != formula:
                raise RuntimeError(f"{name}: the caches hold {measured} bytes, the formula says {formula}")
            results[name] = {"num_kv_heads": kv_heads, "measured_bytes": measured, "formula_bytes": formula}
    finally:
        torch.set_num_threads(previous_threads)
    for entry in results.values():
        entry["ratio_to_mha"] = entry["measured_bytes"] / results["mha"]["measured_bytes"]
    return {**results, "config": dict(CONFIG)}
