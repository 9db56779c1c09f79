"""Peak memory of tiled (online-softmax) attention against naive attention, and its error (CPU, float32).

Naive attention is the library's :func:`~attention_course.scaled_dot_product_attention`, which materialises
the ``(L, L)`` scores and weights; tiled attention is :func:`~attention_course.tiled.tiled_attention`,
which holds one ``(block, block)`` tile at a time. Peak memory is what each call allocates at its highest
point, net of frees, measured with PyTorch's profiler (:func:`~attention_course.cost.measure_peak_memory`);
the inputs exist before the call and do not count, the output does. The error is the largest absolute
difference from ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention_course.attention import scaled_dot_product_attention
from attention_course.cost import measure_peak_memory
from attention_course.tiled import tiled_attention

CONFIG = {"batch": 1, "heads": 1, "length": 4096, "d_head": 64, "block_size": 64, "dtype": "float32", "threads": 1}


def run() -> dict:
    """Return ``{"length", "peak_memory_ratio", "max_abs_error", "naive_peak_mib", "tiled_peak_mib", ...}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        generator = torch.Generator().manual_seed(0)
        shape = (CONFIG["batch"], CONFIG["heads"], CONFIG["length"], CONFIG["d_head"])
        query, key, value = (torch.randn(*shape, generator=generator) for _ in range(3))
        with torch.no_grad():
            naive, naive_peak = measure_peak_memory(lambda: scaled_dot_product_attention(query, key, value)[0])
            tiled, tiled_peak = measure_peak_memory(
                lambda: tiled_attention(query, key, value, block_size=CONFIG["block_size"])
            )
            reference = F.scaled_dot_product_attention(query, key, value)
    finally:
        torch.set_num_threads(previous_threads)
    length = CONFIG["length"]
    scores_bytes = CONFIG["batch"] * CONFIG["heads"] * length * length * 4
    return {
        "length": length,
        "peak_memory_ratio": tiled_peak / naive_peak,
        "max_abs_error": float((tiled - reference).abs().max()),
        "naive_max_abs_error": float((naive - reference).abs().max()),
        "naive_peak_mib": naive_peak / 2**20,
        "tiled_peak_mib": tiled_peak / 2**20,
        "score_matrix_mib": scores_bytes / 2**20,
        "output_mib": naive.numel() * 4 / 2**20,
        "config": dict(CONFIG),
    }
