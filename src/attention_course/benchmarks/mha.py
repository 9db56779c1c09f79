"""Time of the library's MultiHeadAttention relative to ``nn.MultiheadAttention`` (forward plus backward, CPU).

Both modules share the same weights and input (self-attention, batch-first). PyTorch's module runs with
``need_weights=False``, which lets it use its fused attention kernel; the library's module always computes
and returns the per-head weights. The two are timed alternately in one process so that load from other
programs affects both alike, and the figure is the median over repetitions of the per-repetition ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from attention_course.multihead import MultiHeadAttention

CONFIG = {"batch": 16, "length": 128, "d_model": 256, "num_heads": 8, "threads": 2, "dtype": "float32"}


def _time_once(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def run(repeats: int = 60, warmup: int = 10) -> dict:
    """Return ``{"ratio", "library_ms", "torch_ms", "config"}``; ratio > 1 means the library is slower."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(CONFIG["threads"])
    try:
        generator = torch.Generator().manual_seed(0)
        batch, length, d_model = CONFIG["batch"], CONFIG["length"], CONFIG["d_model"]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            reference = nn.MultiheadAttention(d_model, CONFIG["num_heads"], batch_first=True)
        library = MultiHeadAttention.from_torch(reference)
        x = torch.randn(batch, length, d_model, generator=generator, requires_grad=True)

        def library_step() -> None:
            output, _ = library(x, x, x)
            output.sum().backward()

        def torch_step() -> None:
            output, _ = reference(x, x, x, need_weights=False)
            output.sum().backward()

        for _ in range(warmup):
            library_step()
            torch_step()
        library_s, torch_s, ratios = [], [], []
        for index in range(repeats):
            # Alternate which one goes first, so neither always runs on a cache warmed by the other.
            if index % 2 == 0:
                a, b = _time_once(library_step), _time_once(torch_step)
            else:
                b, a = _time_once(torch_step), _time_once(library_step)
            library_s.append(a)
            torch_s.append(b)
            ratios.append(a / b)
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "ratio": statistics.median(ratios),
        "library_ms": 1e3 * statistics.median(library_s),
        "torch_ms": 1e3 * statistics.median(torch_s),
        "repeats": repeats,
        "config": dict(CONFIG),
    }
