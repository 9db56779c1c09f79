"""Grouped-query attention (Ainslie et al. 2023) and multi-query attention (Shazeer 2019).

Multi-head attention gives every query head its own key and value head, so a KV cache holds ``H`` key and
value heads per layer. Grouped-query attention keeps ``Hq`` query heads but only ``Hkv`` key/value heads,
``Hkv`` dividing ``Hq``: query heads ``g·G .. g·G + G - 1`` (``G = Hq / Hkv``, a *group*) all read key/value
head ``g``. Multi-query attention is the extreme ``Hkv = 1``; multi-head attention is ``Hkv = Hq``.

The grouping is done by a reshape, not a copy: queries ``(B, Hq, Lq, d)`` are viewed as ``(B, Hkv, G, Lq, d)``
and keys/values ``(B, Hkv, Lk, d)`` as ``(B, Hkv, 1, Lk, d)``, which broadcast over the group. The result
equals repeating each key/value head ``G`` times in a row (``repeat_interleave``), which is what
``F.scaled_dot_product_attention(..., enable_gqa=True)`` does. The grouped tensors then go through the
library's one kernel, :func:`~attention_course.scaled_dot_product_attention`, with an additive bias (ALiBi)
grouped the same way, so half precision and masking behave the same for every number of key/value heads.
"""

from __future__ import annotations

from torch import Tensor

from attention_course.attention import check_bias, check_mask, scaled_dot_product_attention
from attention_course.checks import check_tensor

__all__ = ["grouped_query_attention"]


def _check_gqa(query: Tensor, key: Tensor, value: Tensor) -> tuple[int, int]:
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, tensor)
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, d_head), got {tuple(tensor.shape)}")
    if key.shape[:3] != value.shape[:3]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must agree on "
                         "(batch, kv_heads, length)")
    if query.size(0) != key.size(0):
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must have the same batch size")
    if query.size(-1) != key.size(-1):
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must have the same d_head")
    query_heads, kv_heads = query.size(1), key.size(1)
    if query_heads % kv_heads != 0:
        raise ValueError(f"the number of query heads ({query_heads}) must be divisible by the number of "
                         f"key/value heads ({kv_heads}): each group of query heads shares one key/value head")
    return query_heads, kv_heads


def _group_heads(scores_like: Tensor, kv_heads: int, group: int) -> Tensor:
    """A mask or bias broadcastable to ``(B, Hq, Lq, Lk)`` -> one broadcastable to ``(B, Hkv, G, Lq, Lk)``."""
    scores_like = scores_like.reshape((1,) * (4 - scores_like.dim()) + tuple(scores_like.shape))  # (b, h, lq, lk)
    if scores_like.size(1) == 1:
        return scores_like.unsqueeze(2)  # (b, 1, 1, lq, lk): the same for every head
    return scores_like.unflatten(1, (kv_heads, group))  # (b, Hkv, G, lq, lk), h = Hq


def _group_mask(mask: Tensor, shape: tuple[int, ...], kv_heads: int, group: int) -> Tensor:
    """A mask broadcastable to ``(B, Hq, Lq, Lk)`` -> one broadcastable to ``(B, Hkv, G, Lq, Lk)``."""
    check_mask(mask, shape)
    return _group_heads(mask, kv_heads, group)


def grouped_query_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention where groups of query heads share one key/value head.

    Args:
        query: ``(B, Hq, Lq, d)``.
        key: ``(B, Hkv, Lk, d)``; ``Hkv`` must divide ``Hq``. Query head ``h`` reads key/value head
            ``h // (Hq / Hkv)``.
        value: ``(B, Hkv, Lk, d_v)``.
        mask: optional bool tensor broadcastable to ``(B, Hq, Lq, Lk)``, True = may attend.
        dropout_p: dropout on the attention weights (the caller passes 0 at evaluation time).
        scale: factor on the scores, default ``1/√d``.
        bias: optional float tensor broadcastable to ``(B, Hq, Lq, Lk)``, added to the scaled scores before
            the softmax (e.g. :func:`~attention_course.alibi_bias`).

    Returns:
        ``(output (B, Hq, Lq, d_v), weights (B, Hq, Lq, Lk))`` like
        :func:`~attention_course.scaled_dot_product_attention`; a query with no allowed key gets zeros.

    Raises:
        ValueError: tensors not 4-D, ``Hq`` not divisible by ``Hkv``, mismatched batch, ``d`` or lengths, or
            a mask or bias that does not broadcast.
        TypeError: non-tensor inputs or a non-boolean mask.
    """
    query_heads, kv_heads = _check_gqa(query, key, value)
    group = query_heads // kv_heads
    batch, _, q_len, _ = query.shape
    scores_shape = (batch, query_heads, q_len, key.size(2))
    if bias is not None:
        check_bias(bias, scores_shape)  # named against the caller's (B, Hq, Lq, Lk), not the grouped layout
    if group == 1:  # multi-head attention: nothing to group
        return scaled_dot_product_attention(query, key, value, mask=mask, dropout_p=dropout_p, scale=scale,
                                            bias=bias)
    grouped_query = query.unflatten(1, (kv_heads, group))  # (B, Hkv, G, Lq, d): a view
    grouped_key, grouped_value = key.unsqueeze(2), value.unsqueeze(2)  # (B, Hkv, 1, Lk, d): broadcast over G
    grouped_mask = None if mask is None else _group_mask(mask, scores_shape, kv_heads, group)
    grouped_bias = None if bias is None else _group_heads(bias, kv_heads, group)
    # The one kernel: float32 for half-precision inputs, autocast off, masked rows zero (attention.py).
    output, weights = scaled_dot_product_attention(grouped_query, grouped_key, grouped_value, mask=grouped_mask,
                                                   dropout_p=dropout_p, scale=scale, bias=grouped_bias)
    return output.flatten(1, 2), weights.flatten(1, 2)  # (B, Hq, Lq, d_v), (B, Hq, Lq, Lk)
