"""What attention costs: multiply-adds of a layer, bytes of a KV cache, and measured peak memory.

- :func:`layer_macs` counts the multiply-adds of one Transformer layer as a function of the length ``n`` (the
  ``n²·d`` of the score and weighted-sum products against the ``n·d²`` of everything else).
- :func:`kv_cache_bytes` gives the size of a KV cache for multi-head, grouped-query or multi-query attention.
- :func:`measure_peak_memory` measures how many bytes a computation allocates at its peak, on CPU or GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch

from attention_course.checks import check_int

__all__ = ["kv_cache_bytes", "layer_macs", "measure_peak_memory"]

T = TypeVar("T")


def layer_macs(length: int, d_model: int, d_ff: int, key_length: int | None = None) -> dict[str, int]:
    """Multiply-adds of one attention + feed-forward layer on one sequence, split by where they happen.

    For ``n = length`` queries, ``m = key_length`` keys (default ``n``: self-attention) and width ``d``:

    ========================  =======================  ==========================================
    part                      multiply-adds            why
    ========================  =======================  ==========================================
    ``projections``           ``2·n·d² + 2·m·d²``      Q and the output from n rows, K and V from m
    ``scores``                ``n·m·d``                ``Q Kᵀ``: one d-long dot product per pair
    ``weighted_sum``          ``n·m·d``                ``A V``: one d-long weighted sum per pair
    ``feed_forward``          ``2·n·d·d_ff``           ``d -> d_ff -> d`` for every position
    ========================  =======================  ==========================================

    The number of heads does not appear: ``h`` heads of width ``d/h`` cost the same as one of width ``d``.
    Softmax, LayerNorm, biases and residual additions are ``O(n·m)`` or ``O(n·d)`` element-wise operations,
    not multiply-adds, and are left out. One multiply-add is two FLOPs.

    Returns:
        ``{"projections", "scores", "weighted_sum", "feed_forward"}`` -> multiply-adds (Python ints).
    """
    key_length = length if key_length is None else key_length
    for name, value in (("length", length), ("d_model", d_model), ("d_ff", d_ff), ("key_length", key_length)):
        check_int(name, value)
    n, m, d = length, key_length, d_model
    return {
        "projections": 2 * n * d * d + 2 * m * d * d,
        "scores": n * m * d,
        "weighted_sum": n * m * d,
        "feed_forward": 2 * n * d * d_ff,
    }


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, d_head: int, length: int, batch: int = 1, bytes_per_value: int = 2
) -> int:
    """Bytes a KV cache holds: ``2 (K and V) · layers · kv_heads · d_head · length · batch · bytes``.

    Multi-head attention has ``num_kv_heads = num_heads``; multi-query attention (Shazeer 2019) shares one
    key/value head across all query heads (``num_kv_heads = 1``); grouped-query attention (Ainslie et al.
    2023) uses a few groups in between. ``bytes_per_value`` is 2 for float16/bfloat16, 4 for float32.
    """
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("d_head", d_head),
                        ("length", length), ("batch", batch), ("bytes_per_value", bytes_per_value)):
        check_int(name, value)
    return 2 * num_layers * num_kv_heads * d_head * length * batch * bytes_per_value


def _profiled_cpu_peak(fn: Callable[[], T]) -> tuple[T, int]:
    # torch.profiler with profile_memory=True records every CPU allocation and free made through PyTorch's
    # allocator (not Python objects, not memory allocated before the profiler started) as a "[memory]"
    # event with a signed size in bytes. Sorting them by time and taking the running sum gives the bytes
    # held at each moment; its maximum is the peak. Only public profiler objects are used: the profile's
    # results and their events' name(), device_type(), start_ns() and nbytes().
    from torch.profiler import ProfilerActivity, profile

    # Kineto (the profiler's backend) prints a line to stderr at every start and stop; level 6 silences its
    # log unless the user has chosen a level. It is read when the profiler first starts in a process.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return result, peak


def _warm_cuda_libraries(device: torch.device) -> None:
    """Run one small product of each kind (mm, addmm, bmm), so that cuBLAS's persistent workspaces exist."""
    a = torch.ones(8, 8, device=device)
    torch.mm(a, a)
    torch.addmm(a[0], a, a)
    torch.bmm(a[None], a[None])


def measure_peak_memory(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[T, int]:
    """Run ``fn()`` and return ``(its result, the peak bytes it allocated on device)``.

    The peak counts memory allocated *during* the call, net of what the call frees, at its highest point;
    tensors that existed before the call do not count. The result of ``fn`` is kept alive, so its own size is
    included.

    - CPU: PyTorch's profiler with ``profile_memory=True`` (every allocation and free through PyTorch's CPU
      allocator, in time order). ``tracemalloc`` cannot do this (it sees only Python's own allocations), and the
      process's resident memory is blurred by the system allocator keeping freed pages.
    - CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the bytes allocated
      before the call. The first matrix product on a GPU allocates cuBLAS's workspace (32 MiB on an H100) through
      the same allocator and keeps it, so a small product runs before the first measurement: otherwise the
      first call measured would carry that workspace (it did, making attention at n = 1024 look larger than
      at n = 2048).

    The profiler slows the code down (a few microseconds per operation, plus about a second the first time
    it starts), so time and memory must be measured in separate runs.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return _profiled_cpu_peak(fn)
    if device.type == "cuda":
        _warm_cuda_libraries(device)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - before
    raise ValueError(f"measure_peak_memory supports 'cpu' and 'cuda' devices, got {device}")
