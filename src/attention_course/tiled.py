"""Tiled attention with an online softmax: exact attention without the ``(Lq, Lk)`` score matrix.

- :func:`online_softmax_update` folds one block of scores into a running maximum and a running sum
  (Milakov & Gimelshein 2018); :func:`online_softmax` uses it to normalise in one pass.
- :func:`tiled_attention_step` does the same for a block of keys *and* values.
- :func:`tiled_attention` loops over query blocks and key blocks, as FlashAttention does (Dao et al. 2022),
  and is a :class:`torch.autograd.Function` whose backward pass recomputes each tile of scores from the
  saved queries, keys, values, output and row-wise log-sum-exp, so that training, too, never holds more
  than a ``(block, block)`` tile of scores per batch item and head.

Conventions are the library's: any leading batch dims, boolean masks with True = may attend, and a query
with no allowed key gets a zero output (and zero gradients), never NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attention_course.attention import check_mask
from attention_course.checks import check_bool, check_int, check_qkv

__all__ = ["online_softmax", "online_softmax_update", "tiled_attention", "tiled_attention_step"]


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
    check_int("block_size", block_size)
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


def _check_tiled_inputs(query: Tensor, key: Tensor, value: Tensor, block_size: int) -> None:
    # Shapes are checked exactly as scaled_dot_product_attention checks them; tiling adds dtype rules.
    check_qkv(query, key, value)
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    check_int("block_size", block_size)


def _tile_mask(mask: Tensor | None, causal: bool, q_start: int, q_end: int, k_start: int, k_end: int,
               device: torch.device) -> Tensor | None:
    """The (broadcastable) boolean mask of one ``(bq, bk)`` tile: the user's mask, the causal one, or both."""
    tile = None if mask is None else mask[..., q_start:q_end, k_start:k_end]
    if causal and k_end - 1 > q_start:  # the tile straddles the diagonal: hide its upper part
        rows = torch.arange(q_start, q_end, device=device).unsqueeze(1)  # (bq, 1)
        allowed = torch.arange(k_start, k_end, device=device).unsqueeze(0) <= rows  # (bq, bk)
        tile = allowed if tile is None else tile & allowed
    return tile


def _key_stop(causal: bool, q_end: int, k_len: int) -> int:
    # Causal: the last query of the block is q_end - 1, so keys from q_end on are hidden from all of it.
    return min(k_len, q_end) if causal else k_len


def _tiled_forward(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, block_size: int,
                   causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """Output ``(..., Lq, d_v)`` and row-wise log-sum-exp ``(..., Lq)`` (``-inf`` for a row with no key)."""
    batch_shape = query.shape[:-2]
    q_len, k_len, d_v = query.size(-2), key.size(-2), value.size(-1)
    factory = dict(dtype=query.dtype, device=query.device)
    output = torch.empty(*batch_shape, q_len, d_v, **factory)  # (..., Lq, d_v)
    log_sum_exp = torch.empty(*batch_shape, q_len, **factory)  # (..., Lq)
    for q_start in range(0, q_len, block_size):
        q_end = min(q_start + block_size, q_len)
        rows = q_end - q_start
        accumulator = torch.zeros(*batch_shape, rows, d_v, **factory)
        running_max = torch.full((*batch_shape, rows), -math.inf, **factory)
        running_sum = torch.zeros(*batch_shape, rows, **factory)
        for k_start in range(0, _key_stop(causal, q_end, k_len), block_size):
            k_end = min(k_start + block_size, k_len)
            tile_mask = _tile_mask(mask, causal, q_start, q_end, k_start, k_end, query.device)
            accumulator, running_max, running_sum = tiled_attention_step(
                accumulator, running_max, running_sum, query[..., q_start:q_end, :],
                key[..., k_start:k_end, :], value[..., k_start:k_end, :], scale, tile_mask,
            )
        # A row that saw no key at all has ℓ = 0 and O = 0: divide by 1 instead, giving a zero output.
        seen = running_sum > 0
        denominator = torch.where(seen, running_sum, torch.ones_like(running_sum))
        output[..., q_start:q_end, :] = accumulator / denominator.unsqueeze(-1)
        # L = m + log ℓ: all the backward pass needs to rebuild any weight, P_ij = exp(S_ij - L_i).
        log_sum_exp[..., q_start:q_end] = torch.where(seen, running_max + torch.log(denominator),
                                                      torch.full_like(running_max, -math.inf))
    return output, log_sum_exp


def _tiled_backward(grad_output: Tensor, query: Tensor, key: Tensor, value: Tensor, output: Tensor,
                    log_sum_exp: Tensor, mask: Tensor | None, block_size: int, causal: bool,
                    scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention's backward pass: gradients of query, key and value, one recomputed tile at a time.

    With ``S = scale·Q Kᵀ``, ``P = exp(S - L)`` (rebuilt from the saved log-sum-exp ``L``), ``O = P V`` and
    ``dO`` the incoming gradient:

        dV = Pᵀ dO      dP = dO Vᵀ      dS = P ∘ (dP - D),  D_i = rowsum(dO ∘ O)_i = Σ_j P_ij dP_ij
        dQ = scale · dS K      dK = scale · dSᵀ Q

    ``D`` is the softmax's correction term, computed once from ``dO`` and ``O`` instead of from the full
    ``P``. The outer loop runs over key blocks (each one's ``dK``, ``dV`` finished in one go) and the inner
    one over query blocks (``dQ`` accumulated), the order of FlashAttention's backward pass (Dao et al. 2022,
    Algorithm 4). Saving only ``O`` and the one log-sum-exp ``L`` per row, rather than the row's maximum and
    sum separately, is FlashAttention-2's form (Dao 2023).
    """
    q_len, k_len = query.size(-2), key.size(-2)
    delta = (grad_output * output).sum(dim=-1)  # (..., Lq): D
    # Rows with no key have L = -inf: use +inf there, so that their P = exp(S - inf) is 0, not NaN.
    safe_lse = log_sum_exp.masked_fill(torch.isneginf(log_sum_exp), math.inf)
    # Fresh dense tensors (zeros_like could keep the zero strides of an expanded, broadcast input).
    grad_query, grad_key, grad_value = (torch.zeros(t.shape, dtype=t.dtype, device=t.device)
                                        for t in (query, key, value))
    for k_start in range(0, k_len, block_size):
        k_end = min(k_start + block_size, k_len)
        key_block, value_block = key[..., k_start:k_end, :], value[..., k_start:k_end, :]  # (..., bk, d)
        # Causal: queries before k_start see none of this block; start at the block that holds query k_start.
        first = (k_start // block_size) * block_size if causal else 0
        for q_start in range(first, q_len, block_size):
            q_end = min(q_start + block_size, q_len)
            query_block = query[..., q_start:q_end, :]  # (..., bq, d)
            scores = torch.matmul(query_block * scale, key_block.transpose(-2, -1))  # (..., bq, bk)
            tile_mask = _tile_mask(mask, causal, q_start, q_end, k_start, k_end, query.device)
            if tile_mask is not None:
                scores = scores.masked_fill(~tile_mask, -math.inf)
            weights = torch.exp(scores - safe_lse[..., q_start:q_end, None])  # P, recomputed: (..., bq, bk)
            grad_out_block = grad_output[..., q_start:q_end, :]  # (..., bq, d_v)
            grad_value[..., k_start:k_end, :] += torch.matmul(weights.transpose(-2, -1), grad_out_block)
            grad_weights = torch.matmul(grad_out_block, value_block.transpose(-2, -1))  # dP: (..., bq, bk)
            grad_scores = weights * (grad_weights - delta[..., q_start:q_end, None])  # dS
            grad_query[..., q_start:q_end, :] += scale * torch.matmul(grad_scores, key_block)
            grad_key[..., k_start:k_end, :] += scale * torch.matmul(grad_scores.transpose(-2, -1), query_block)
    return grad_query, grad_key, grad_value


class TiledAttentionFunction(torch.autograd.Function):
    """Autograd for :func:`tiled_attention`: saves Q, K, V, the output and the log-sum-exp, nothing ``n²``."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, block_size: int,
                causal: bool, scale: float) -> Tensor:
        output, log_sum_exp = _tiled_forward(query, key, value, mask, block_size, causal, scale)
        ctx.save_for_backward(query, key, value, output, log_sum_exp, mask)
        ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor):
        query, key, value, output, log_sum_exp, mask = ctx.saved_tensors
        grads = _tiled_backward(grad_output.contiguous(), query, key, value, output, log_sum_exp, mask,
                                ctx.block_size, ctx.causal, ctx.scale)
        return (*grads, None, None, None, None)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_size: int = 64,
    is_causal: bool = False,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    causal: bool | None = None,
) -> Tensor:
    """Exact attention ``softmax(Q Kᵀ · scale) V`` computed tile by tile, never forming the full score matrix.

    For each block of ``block_size`` queries, the key/value blocks are visited in order and folded into a
    running maximum, running sum and unnormalised output with :func:`tiled_attention_step`; the block's
    output is the accumulator divided by the sum. Extra memory is ``O(block_size²)`` per batch item and head
    for the score tile, plus the output and one log-sum-exp per query, instead of ``O(Lq·Lk)``. The backward
    pass (``TiledAttentionFunction``) recomputes the tiles, so training saves the memory too.

    Args:
        query: ``(..., Lq, d_k)``.
        key: ``(..., Lk, d_k)``.
        value: ``(..., Lk, d_v)``; leading dims of the three must broadcast.
        block_size: rows of queries and of keys per tile (at least 1); lengths need not be multiples of it.
        is_causal: if True, query ``i`` sees keys ``j <= i`` only, counting both from 0 ("top-left aligned",
            exactly like ``is_causal=True`` in ``F.scaled_dot_product_attention``). When ``Lq != Lk`` this is
            *not* "the last query sees every key": with ``Lq < Lk`` the trailing keys are seen by nobody. For
            a decoder step whose queries are the *last* positions use an explicit ``mask`` instead. Key
            blocks entirely above the diagonal are skipped.
        mask: optional bool tensor broadcastable to ``(..., Lq, Lk)``, True = may attend (combined with
            ``is_causal`` when both are given). It is sliced tile by tile, never expanded in memory.
        scale: factor on the scores; default ``1/√d_k``.
        causal: the name of ``is_causal`` in earlier versions of the course, still accepted.

    Returns:
        ``(..., Lq, d_v)``, equal to ``F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)``
        up to floating-point rounding, with gradients equal to its gradients. With ``Lk = 0`` every output row
        is zero.

    Raises:
        TypeError: non-tensor or non-floating inputs, mixed dtypes, a non-int ``block_size``, a non-bool
            ``is_causal``, a non-boolean mask.
        ValueError: ``block_size < 1``, mismatched ``d_k`` or key/value lengths, batch dims that do not
            broadcast, a mask that does not broadcast to the scores.
    """
    if causal is not None:
        check_bool("causal", causal)
        is_causal = causal
    check_bool("is_causal", is_causal)
    _check_tiled_inputs(query, key, value, block_size)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    q_len, k_len = query.size(-2), key.size(-2)
    if mask is not None:
        check_mask(mask, (*batch_shape, q_len, k_len))
        # A view with the last two dims at full size, so that tiles can be sliced; no memory is allocated.
        mask = mask.to(query.device).expand(*mask.shape[:-2], q_len, k_len)
    # Views at the common batch shape (no copy); autograd sums the gradients back to each input's shape.
    query = query.expand(*batch_shape, *query.shape[-2:])
    key = key.expand(*batch_shape, *key.shape[-2:])
    value = value.expand(*batch_shape, *value.shape[-2:])
    return TiledAttentionFunction.apply(query, key, value, mask, block_size, is_causal, float(scale))
