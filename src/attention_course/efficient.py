"""Making attention fast: its cost, a KV cache for decoding, and tiled (online-softmax) attention.

Three tools, each built step by step in chapter 11:

- **Cost.** :func:`layer_macs` counts the multiply-adds of one Transformer layer as a function of the length
  ``n`` (the ``n²·d`` of the score and weighted-sum products against the ``n·d²`` of everything else), and
  :func:`measure_peak_memory` measures how many bytes a computation allocates at its peak, on CPU or GPU.
- **KV cache.** When a decoder generates token ``t``, the keys and values of tokens ``0..t-1`` are the same
  as at the previous step. :class:`KVCache` keeps them, :func:`cached_self_attention` attends from the new
  positions only, and :func:`cached_greedy_decode` runs the whole encoder–decoder that way; its output equals
  recomputing the full prefix at every step.
- **Tiled attention.** :func:`online_softmax_update` folds one block of scores into a running maximum and a
  running sum (Milakov & Gimelshein 2018); :func:`tiled_attention_step` does the same for a block of keys
  *and* values; :func:`tiled_attention` loops over query blocks and key blocks, as FlashAttention does
  (Dao et al. 2022), and never holds more than one ``(block, block)`` tile of scores per batch item and head.

Conventions are the library's: per-head tensors are ``(batch, heads, length, d_head)`` (any leading dims for
the attention functions), boolean masks mean True = may attend, and a query with no allowed key gets a zero
output, never NaN.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from attention_course.attention import _check_qkv, scaled_dot_product_attention
from attention_course.decoding import _check_common, _source_mask
from attention_course.layers import DecoderLayer
from attention_course.multihead import MultiHeadAttention
from attention_course.transformer import Transformer

__all__ = [
    "DecodingCache",
    "KVCache",
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

T = TypeVar("T")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


# ---------------------------------------------------------------------------------------------------------
# The cost of attention
# ---------------------------------------------------------------------------------------------------------
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
        _check_positive_int(name, value)
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
        _check_positive_int(name, value)
    return 2 * num_layers * num_kv_heads * d_head * length * batch * bytes_per_value


def _profiled_cpu_peak(fn: Callable[[], T]) -> tuple[T, int]:
    # torch.profiler with profile_memory=True records every CPU allocation and free made through PyTorch's
    # allocator (not Python objects, not memory allocated before the profiler started) as an "Allocation"
    # event with a signed size. Sorting them by time and taking the running sum gives the bytes held at each
    # moment; its maximum is the peak. The event tree is a semi-private API, stable since torch 2.0.
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    # Kineto (the profiler's backend) prints a line to stderr at every start and stop; level 6 silences its
    # log unless the user has chosen a level. It is read when the profiler first starts in a process.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return result, peak


def measure_peak_memory(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[T, int]:
    """Run ``fn()`` and return ``(its result, the peak bytes it allocated on device)``.

    The peak counts memory allocated *during* the call, net of what the call frees, at its highest point;
    tensors that existed before the call do not count. The result of ``fn`` is kept alive, so its own size is
    included.

    - CPU: PyTorch's profiler with ``profile_memory=True`` (every allocation and free through PyTorch's CPU
      allocator, in time order). ``tracemalloc`` cannot do this (it sees only Python's own allocations), and the
      process's resident memory is blurred by the system allocator keeping freed pages.
    - CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the bytes allocated
      before the call.

    The profiler slows the code down (a few microseconds per operation, plus about a second the first time
    it starts), so time and memory must be measured in separate runs.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return _profiled_cpu_peak(fn)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - before
    raise ValueError(f"measure_peak_memory supports 'cpu' and 'cuda' devices, got {device}")


# ---------------------------------------------------------------------------------------------------------
# The online softmax
# ---------------------------------------------------------------------------------------------------------
def _safe_shift(running_max: Tensor) -> Tensor:
    # Where nothing has been seen yet (max = -inf), shift by 0 instead: exp(-inf - (-inf)) would be NaN.
    return torch.where(torch.isneginf(running_max), torch.zeros_like(running_max), running_max)


def online_softmax_update(running_max: Tensor, running_sum: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
    """Fold one block of scores into a running maximum ``m`` and running sum ``ℓ = Σ exp(s - m)``.

        m' = max(m, max_j s_j)
        ℓ' = ℓ · exp(m - m') + Σ_j exp(s_j - m')

    The old sum was taken relative to the old maximum; multiplying it by ``exp(m - m')`` re-expresses it
    relative to the new one. Start from ``m = -inf`` and ``ℓ = 0``; after the last block,
    ``softmax(s)_j = exp(s_j - m) / ℓ``, and ``m + log ℓ`` is the log-sum-exp of all the scores.

    Args:
        running_max: ``(...)`` maximum of the scores seen so far (``-inf`` before the first block).
        running_sum: ``(...)`` sum of ``exp(score - running_max)`` over the scores seen so far.
        scores: ``(..., b)`` the next block of ``b`` scores for each row; ``-inf`` marks a masked score.

    Returns:
        ``(new_max, new_sum)``, both ``(...)``. A row whose scores are all ``-inf`` so far keeps ``(-inf, 0)``.
    """
    if not all(isinstance(t, Tensor) for t in (running_max, running_sum, scores)):
        raise TypeError("running_max, running_sum and scores must be torch.Tensors")
    if scores.dim() < 1 or running_max.shape != scores.shape[:-1] or running_sum.shape != scores.shape[:-1]:
        raise ValueError(
            f"running_max {tuple(running_max.shape)} and running_sum {tuple(running_sum.shape)} must have the "
            f"shape of scores {tuple(scores.shape)} without its last (block) dimension"
        )
    new_max = torch.maximum(running_max, scores.amax(dim=-1))  # (...)
    shift = _safe_shift(new_max)
    rescale = torch.exp(running_max - shift)  # (...): exp(m - m'), 0 where m = -inf
    new_sum = running_sum * rescale + torch.exp(scores - shift.unsqueeze(-1)).sum(dim=-1)
    return new_max, new_sum


def online_softmax(scores: Tensor, block_size: int = 64) -> Tensor:
    """Softmax over the last dimension, with its normaliser computed block by block in one pass.

    Pass 1 streams over blocks of ``block_size`` scores with :func:`online_softmax_update`; pass 2 writes
    ``exp(s - m) / ℓ``. Equal to ``torch.softmax(scores, -1)``; it exists to show that the normaliser needs
    no second look at earlier blocks. A row of all ``-inf`` gives zeros (the library's convention).

    Args:
        scores: ``(..., n)``.
        block_size: scores per block (at least 1).
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    _check_positive_int("block_size", block_size)
    running_max = torch.full(scores.shape[:-1], -math.inf, dtype=scores.dtype, device=scores.device)
    running_sum = torch.zeros_like(running_max)
    for start in range(0, scores.size(-1), block_size):
        running_max, running_sum = online_softmax_update(running_max, running_sum,
                                                         scores[..., start:start + block_size])
    weights = torch.exp(scores - _safe_shift(running_max).unsqueeze(-1))  # (..., n)
    denominator = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum)).unsqueeze(-1)
    return weights / denominator


# ---------------------------------------------------------------------------------------------------------
# Tiled attention
# ---------------------------------------------------------------------------------------------------------
def tiled_attention_step(
    accumulator: Tensor,
    running_max: Tensor,
    running_sum: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scale: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one block of keys and values into the running state of one block of queries.

    With ``s = scale · q kᵀ`` for the block, ``p = exp(s - m')`` and ``c = exp(m - m')``:

        m' = max(m, rowmax(s))     ℓ' = c·ℓ + rowsum(p)     O' = c·O + p v

    ``O`` is the *unnormalised* output, ``Σ_j exp(s_j - m) v_j``; after the last block the attention output is
    ``O / ℓ``. Only the ``(bq, bk)`` tile of scores of this block exists at any time.

    Args:
        accumulator: ``(..., bq, d_v)`` unnormalised output ``O`` so far (zeros at the start).
        running_max: ``(..., bq)`` running maximum score ``m`` per query (``-inf`` at the start).
        running_sum: ``(..., bq)`` running sum ``ℓ`` per query (zeros at the start).
        query: ``(..., bq, d_k)`` the block of queries.
        key: ``(..., bk, d_k)`` the block of keys.
        value: ``(..., bk, d_v)`` the block of values.
        scale: factor on the scores, usually ``1/√d_k``.
        mask: optional bool ``(bq, bk)`` (or broadcastable to the tile), True = may attend.

    Returns:
        ``(accumulator, running_max, running_sum)`` updated, same shapes as given.
    """
    scores = torch.matmul(query * scale, key.transpose(-2, -1))  # (..., bq, bk): the only tile of scores
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    new_max = torch.maximum(running_max, scores.amax(dim=-1))  # (..., bq)
    shift = _safe_shift(new_max)
    rescale = torch.exp(running_max - shift)  # (..., bq): how much the old state shrinks
    probabilities = torch.exp(scores - shift.unsqueeze(-1))  # (..., bq, bk), masked scores -> 0
    new_sum = running_sum * rescale + probabilities.sum(dim=-1)
    new_accumulator = accumulator * rescale.unsqueeze(-1) + torch.matmul(probabilities, value)  # (..., bq, d_v)
    return new_accumulator, new_max, new_sum


def _check_tiled_inputs(query: Tensor, key: Tensor, value: Tensor, block_size: int, causal: bool) -> None:
    # Shapes are checked exactly as scaled_dot_product_attention checks them; tiling adds dtype rules.
    _check_qkv(query, key, value)
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    _check_positive_int("block_size", block_size)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    causal: bool = False,
    block_size: int = 64,
    scale: float | None = None,
) -> Tensor:
    """Exact attention ``softmax(Q Kᵀ · scale) V`` computed tile by tile, never forming the full score matrix.

    For each block of ``block_size`` queries, the key/value blocks are visited in order and folded into a
    running maximum, running sum and unnormalised output with :func:`tiled_attention_step`; the block's
    output is the accumulator divided by the sum. Extra memory is ``O(block_size²)`` per batch item and head
    for the score tile, plus the output itself, instead of ``O(Lq·Lk)`` for the score matrix.

    Args:
        query: ``(..., Lq, d_k)``.
        key: ``(..., Lk, d_k)``.
        value: ``(..., Lk, d_v)``; leading dims of the three must broadcast.
        causal: if True, query ``i`` sees keys ``j <= i`` only, counting both from 0 ("top-left aligned",
            exactly like ``is_causal=True`` in ``F.scaled_dot_product_attention``). When ``Lq != Lk`` this is
            *not* "the last query sees every key": with ``Lq < Lk`` the trailing keys are seen by nobody. For
            a decoder step whose queries are the *last* positions use an explicit mask instead (see
            :func:`cached_self_attention`). Key blocks entirely above the diagonal are skipped.
        block_size: rows of queries and of keys per tile (at least 1); lengths need not be multiples of it.
        scale: factor on the scores; default ``1/√d_k``.

    Returns:
        ``(..., Lq, d_v)``, equal to ``F.scaled_dot_product_attention(query, key, value, is_causal=causal)``
        up to floating-point rounding. With ``Lk = 0`` every output row is zero.

    Raises:
        TypeError: non-tensor or non-floating inputs, mixed dtypes, a non-int ``block_size``.
        ValueError: ``block_size < 1``, mismatched ``d_k`` or key/value lengths, batch dims that do not broadcast.
    """
    _check_tiled_inputs(query, key, value, block_size, causal)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    q_len, k_len, d_v = query.size(-2), key.size(-2), value.size(-1)
    factory = dict(dtype=query.dtype, device=query.device)
    output = torch.empty(*batch_shape, q_len, d_v, **factory)  # (..., Lq, d_v)
    positions = torch.arange(max(q_len, k_len), device=query.device)

    for q_start in range(0, q_len, block_size):
        q_end = min(q_start + block_size, q_len)
        q_block = query[..., q_start:q_end, :]  # (..., bq, d_k)
        rows = q_end - q_start
        accumulator = torch.zeros(*batch_shape, rows, d_v, **factory)
        running_max = torch.full((*batch_shape, rows), -math.inf, **factory)
        running_sum = torch.zeros(*batch_shape, rows, **factory)
        # Causal: the last query of this block is q_end - 1, so keys from q_end on are hidden from all of it.
        k_stop = min(k_len, q_end) if causal else k_len
        for k_start in range(0, k_stop, block_size):
            k_end = min(k_start + block_size, k_len)
            mask = None
            if causal and k_end - 1 > q_start:  # the tile straddles the diagonal: mask its upper part
                mask = positions[k_start:k_end].unsqueeze(0) <= positions[q_start:q_end].unsqueeze(1)  # (bq, bk)
            accumulator, running_max, running_sum = tiled_attention_step(
                accumulator, running_max, running_sum, q_block,
                key[..., k_start:k_end, :], value[..., k_start:k_end, :], scale, mask,
            )
        # A row that saw no key at all has ℓ = 0 and O = 0: divide by 1 instead, giving a zero output.
        denominator = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))
        output[..., q_start:q_end, :] = accumulator / denominator.unsqueeze(-1)
    return output


# ---------------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------------
class KVCache:
    """The keys and values one attention layer has computed so far, grown by :meth:`append`.

    Attributes:
        keys: ``(B, H, t, d_head)`` or None before the first append.
        values: ``(B, H, t, d_head)`` or None.

    Appending concatenates along the length dimension. (Production caches preallocate ``max_len`` slots and
    write in place, which avoids the copy; the concatenation keeps the idea visible.)
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.size(-2)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions; return all of them so far.

        Args:
            keys: ``(B, H, t_new, d_head)``.
            values: ``(B, H, t_new, d_head_v)``.

        Returns:
            ``(keys, values)`` of every position so far: ``(B, H, t + t_new, ...)``.

        Raises:
            ValueError: not 4-D, keys and values that disagree on (B, H, t_new), or shapes that differ
                from what the cache already holds (other than the length).
        """
        for name, tensor in (("keys", keys), ("values", values)):
            if not isinstance(tensor, Tensor) or tensor.dim() != 4:
                shape = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
                raise ValueError(f"{name} must have shape (batch, heads, new_length, d_head), got {shape}")
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must agree on (batch, heads, length)"
            )
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            for name, new, old in (("keys", keys, self.keys), ("values", values, self.values)):
                if new.shape[:2] != old.shape[:2] or new.shape[3] != old.shape[3]:
                    raise ValueError(
                        f"new {name} of shape {tuple(new.shape)} do not match the cached {name} of shape "
                        f"{tuple(old.shape)} (batch, heads and d_head must stay the same)"
                    )
            self.keys = torch.cat([self.keys, keys], dim=2)  # (B, H, t + t_new, d_head)
            self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values


def _check_attention_input(attention: MultiHeadAttention, x: Tensor, name: str) -> None:
    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(f"attention must be an attention_course.MultiHeadAttention, got {type(attention).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != attention.d_model:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape (batch, length, d_model={attention.d_model}), got {shape}")


def _attend(attention: MultiHeadAttention, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """Queries from ``x (B, t, d_model)``, precomputed per-head keys/values ``(B, H, Lk, d_head)`` -> output."""
    queries = attention.split_heads(attention.w_q(x))  # (B, H, t, d_head)
    dropout_p = attention.dropout if attention.training else 0.0
    heads, _ = scaled_dot_product_attention(queries, keys, values, mask=mask, dropout_p=dropout_p)
    return attention.w_o(attention.merge_heads(heads))  # (B, t, d_model)


def cached_self_attention(attention: MultiHeadAttention, x: Tensor, cache: KVCache) -> Tensor:
    """Causal self-attention for new positions only, reusing the keys and values of earlier ones.

    The new positions' keys and values are projected once and appended to ``cache``; their queries attend to
    every cached position and, among the new ones, to those at or before themselves. Feeding a sequence
    through in pieces (a prompt, then one token at a time) gives the same outputs as
    ``attention(x_all, x_all, x_all, mask=causal_mask(L))`` on the whole sequence.

    Args:
        attention: the layer's :class:`~attention_course.MultiHeadAttention` (its ``w_q, w_k, w_v, w_o``).
        x: ``(B, t_new, d_model)`` the inputs at the new positions.
        cache: this layer's :class:`KVCache`, updated in place.

    Returns:
        ``(B, t_new, d_model)`` the attention outputs at the new positions.
    """
    _check_attention_input(attention, x, "x")
    past = len(cache)
    new_keys = attention.split_heads(attention.w_k(x))  # (B, H, t_new, d_head)
    new_values = attention.split_heads(attention.w_v(x))
    keys, values = cache.append(new_keys, new_values)  # (B, H, past + t_new, d_head)
    mask = None
    if x.size(1) > 1:  # new query i sits at position past + i and may see keys 0 .. past + i
        query_positions = torch.arange(past, past + x.size(1), device=x.device).unsqueeze(1)
        mask = torch.arange(keys.size(2), device=x.device).unsqueeze(0) <= query_positions  # (t_new, past+t_new)
    return _attend(attention, x, keys, values, mask)


class DecodingCache:
    """What incremental decoding keeps for a :class:`~attention_course.Transformer`'s decoder.

    For each decoder layer: a :class:`KVCache` of its self-attention, and the cross-attention keys and values
    of the encoder output, projected once here instead of at every step.

    Args:
        model: the Transformer.
        memory: ``(B, Ls, d_model)`` the encoder output, ``model.encode(src, src_mask)``.
        memory_mask: optional bool mask broadcastable to ``(B, H, 1, Ls)``, usually the source padding mask
            ``(B, 1, 1, Ls)``.

    Attributes:
        self_attention: one :class:`KVCache` per decoder layer.
        cross_keys: one ``(B, H, Ls, d_head)`` tensor per decoder layer.
        cross_values: one ``(B, H, Ls, d_head)`` tensor per decoder layer.
        position: how many target positions have been decoded so far.
    """

    def __init__(self, model: Transformer, memory: Tensor, memory_mask: Tensor | None = None) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be an attention_course.Transformer, got {type(model).__name__}")
        layers = model.decoder.layers
        _check_attention_input(layers[0].cross_attention, memory, "memory")
        self.memory_mask = memory_mask
        self.position = 0
        self.self_attention = [KVCache() for _ in layers]
        self.cross_keys: list[Tensor] = []
        self.cross_values: list[Tensor] = []
        for layer in layers:
            cross = layer.cross_attention
            self.cross_keys.append(cross.split_heads(cross.w_k(memory)))  # (B, H, Ls, d_head)
            self.cross_values.append(cross.split_heads(cross.w_v(memory)))


def decoder_layer_step(
    layer: DecoderLayer,
    x: Tensor,
    self_cache: KVCache,
    cross_keys: Tensor,
    cross_values: Tensor,
    memory_mask: Tensor | None = None,
) -> Tensor:
    """One :class:`~attention_course.DecoderLayer` on new positions only, with cached keys and values.

    The same three sub-layers, residuals, dropouts and LayerNorms as ``DecoderLayer.forward`` (both go through
    ``DecoderLayer.wire_sublayers``); only the attention reads its keys and values from the caches.

    Args:
        layer: the decoder layer.
        x: ``(B, t_new, d_model)`` inputs at the new positions.
        self_cache: this layer's self-attention :class:`KVCache` (updated in place).
        cross_keys, cross_values: ``(B, H, Ls, d_head)`` this layer's projected encoder output.
        memory_mask: optional bool mask broadcastable to ``(B, H, t_new, Ls)``.

    Returns:
        ``(B, t_new, d_model)``.
    """
    if not isinstance(layer, DecoderLayer):
        raise TypeError(f"layer must be an attention_course.DecoderLayer, got {type(layer).__name__}")

    def self_block(h: Tensor) -> Tensor:
        return layer.dropout1(cached_self_attention(layer.self_attention, h, self_cache))

    def cross_block(h: Tensor) -> Tensor:
        return layer.dropout2(_attend(layer.cross_attention, h, cross_keys, cross_values, memory_mask))

    return layer.wire_sublayers(x, self_attention=self_block, cross_attention=cross_block)


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
    for index, layer in enumerate(model.decoder.layers):
        x = decoder_layer_step(layer, x, cache.self_attention[index], cache.cross_keys[index],
                               cache.cross_values[index], cache.memory_mask)
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
    _check_common(src, max_len, bos_id, eos_id)  # the same argument checks as greedy_decode
    src_mask = _source_mask(src, pad_id, src_mask)  # (B, 1, 1, Ls) from pad_id, unless one is given
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
