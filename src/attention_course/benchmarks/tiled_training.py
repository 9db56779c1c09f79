"""Peak memory of tiled attention in *training* (forward + backward) against naive attention (CPU, float32).

Naive attention is the library's :func:`~attention_course.scaled_dot_product_attention`: autograd keeps its
``(L, L)`` weights for the backward pass, which then forms ``(L, L)`` gradients of the weights and scores.
Tiled attention is :func:`~attention_course.tiled_attention`, an autograd Function that keeps only its output
and one log-sum-exp per query and recomputes each ``(block, block)`` tile in the backward pass
(FlashAttention's backward). Each measurement runs one forward and one backward pass from inputs that exist
before the call; the gradients it creates count. ``max_grad_error`` is the largest absolute difference
between the two methods' gradients of query, key and value.
"""

from __future__ import annotations

import torch

from attention_course.attention import scaled_dot_product_attention
from attention_course.cost import measure_peak_memory
from attention_course.tiled import tiled_attention

CONFIG = {"batch": 1, "heads": 1, "length": 2048, "d_head": 64, "block_size": 128, "dtype": "float32",
          "threads": 1}


def _forward_backward(attention, inputs: list[torch.Tensor], grad_output: torch.Tensor) -> list[torch.Tensor]:
    attention(*inputs).backward(grad_output)
    return [tensor.grad for tensor in inputs]


def _clear_grads(inputs: list[torch.Tensor]) -> None:
    # Outside the measured call: freeing earlier gradients inside it would count as negative memory.
    for tensor in inputs:
        tensor.grad = None


def run() -> dict:
    """Return ``{"length", "peak_memory_ratio", "max_grad_error", "naive_peak_mib", "tiled_peak_mib", ...}``."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        generator = torch.Generator().manual_seed(0)
        shape = (CONFIG["batch"], CONFIG["heads"], CONFIG["length"], CONFIG["d_head"])
        inputs = [torch.randn(*shape, generator=generator).requires_grad_() for _ in range(3)]
        grad_output = torch.randn(*shape, generator=generator)

        def naive(q, k, v):
            return scaled_dot_product_attention(q, k, v)[0]

        def tiled(q, k, v):
            return tiled_attention(q, k, v, block_size=CONFIG["block_size"])

        naive_grads, naive_peak = measure_peak_memory(lambda: _forward_backward(naive, inputs, grad_output))
        _clear_grads(inputs)
        tiled_grads, tiled_peak = measure_peak_memory(lambda: _forward_backward(tiled, inputs, grad_output))
    finally:
        torch.set_num_threads(previous_threads)
    length = CONFIG["length"]
    return {
        "length": length,
        "peak_memory_ratio": tiled_peak / naive_peak,
        "goal": "peak_memory_ratio <= 0.25",
        "max_grad_error": max(float((a - b).abs().max()) for a, b in zip(tiled_grads, naive_grads)),
        "naive_peak_mib": naive_peak / 2**20,
        "tiled_peak_mib": tiled_peak / 2**20,
        "score_matrix_mib": CONFIG["batch"] * CONFIG["heads"] * length * length * 4 / 2**20,
        "config": dict(CONFIG),
    }
