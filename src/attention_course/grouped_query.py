"""Grouped-query attention (Ainslie et al. 2023) and multi-query attention (Shazeer 2019).

Multi-head attention gives every query head its own key and value head, so a KV cache holds ``H`` key and
value heads per layer. Grouped-query attention keeps ``Hq`` query heads but only ``Hkv`` key/value heads,
``Hkv`` dividing ``Hq``: query heads ``g·G .. g·G + G - 1`` (``G = Hq / Hkv``, a *group*) all read key/value
head ``g``. Multi-query attention is the extreme ``Hkv = 1``; multi-head attention is ``Hkv = Hq``.

The grouping is done by a reshape, not a copy: queries ``(B, Hq, Lq, d)`` are viewed as ``(B, Hkv, G, Lq, d)``
and keys/values ``(B, Hkv, Lk, d)`` as ``(B, Hkv, 1, Lk, d)``, which broadcast over the group. The result
equals repeating each key/value head ``G`` times in a row (``repeat_interleave``), which is what
``F.scaled_dot_product_attention(..., enable_gqa=True)`` does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_course.attention import check_mask, masked_softmax, scaled_dot_product_attention
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


def _group_mask(mask: Tensor, shape: tuple[int, ...], kv_heads: int, group: int) -> Tensor:
    """A mask broadcastable to ``(B, Hq, Lq, Lk)`` -> one broadcastable to ``(B, Hkv, G, Lq, Lk)``."""
    check_mask(mask, shape)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, lq, lk), h in {1, Hq}
    if mask.size(1) == 1:
        return mask.unsqueeze(2)  # (b, 1, 1, lq, lk): the same for every head
    return mask.unflatten(1, (kv_heads, group))  # (b, Hkv, G, lq, lk)


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
    if group == 1 and bias is None:  # multi-head attention: nothing to group
        return scaled_dot_product_attention(query, key, value, mask=mask, dropout_p=dropout_p, scale=scale)
    batch, _, q_len, d = query.shape
    k_len = key.size(2)
    scores_shape = (batch, query_heads, q_len, k_len)
    grouped_query = query.unflatten(1, (kv_heads, group))  # (B, Hkv, G, Lq, d): a view
    grouped_key, grouped_value = key.unsqueeze(2), value.unsqueeze(2)  # (B, Hkv, 1, Lk, d): broadcast over G
    grouped_mask = None if mask is None else _group_mask(mask, scores_shape, kv_heads, group)
    if bias is None:
        output, weights = scaled_dot_product_attention(grouped_query, grouped_key, grouped_value,
                                                       mask=grouped_mask, dropout_p=dropout_p, scale=scale)
    else:
        check_tensor("bias", bias, floating=True)
        try:
            if torch.broadcast_shapes(bias.shape, scores_shape) != torch.Size(scores_shape):
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to the scores "
                             f"{scores_shape}") from None
        if not 0.0 <= dropout_p < 1.0:
            raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        grouped_bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        grouped_bias = grouped_bias.unsqueeze(2) if grouped_bias.size(1) == 1 else \
            grouped_bias.unflatten(1, (kv_heads, group))  # (b, Hkv or 1, G or 1, Lq, Lk)
        scores = torch.matmul(grouped_query * scale, grouped_key.transpose(-2, -1)) + grouped_bias
        weights = masked_softmax(scores, grouped_mask)  # (B, Hkv, G, Lq, Lk)
        attended = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
        output = torch.matmul(attended, grouped_value)  # (B, Hkv, G, Lq, d_v)
    return output.flatten(1, 2), weights.flatten(1, 2)  # (B, Hq, Lq, d_v), (B, Hq, Lq, Lk)
