"""ALiBi, attention with linear biases (Press et al. 2022): positions as a per-head penalty on distance.

No position is added to the input or rotated into q and k. Instead each head ``h`` adds ``-m_h · |i - j|`` to
the score of query ``i`` and key ``j``: the farther the key, the lower its score, at a head-specific rate
``m_h``. The slopes are a geometric sequence, so some heads look only at their neighbours and others far
back. Because the bias is defined for every distance, a model trained on short sequences meets no unseen
position when it reads longer ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["alibi_bias", "alibi_slopes"]


def _power_of_two_slopes(num_heads: int) -> list[float]:
    start = 2.0 ** (-8.0 / num_heads)  # the first slope is also the ratio of the sequence
    return [start ** (i + 1) for i in range(num_heads)]  # 2^(-8/h), 2^(-16/h), ..., 2^(-8)


def alibi_slopes(num_heads: int) -> Tensor:
    """The per-head slopes ``m_h`` of ALiBi, in float32, shape ``(num_heads,)``.

    For ``h`` a power of two: ``m_i = 2^(-8i/h)`` for ``i = 1..h`` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise
    the paper's rule (and its code): take the slopes for ``n``, the largest power of two below ``h``, then
    add every other slope of the sequence for ``2n``, the odd-numbered ones, until there are ``h``.

    Raises:
        TypeError, ValueError: ``num_heads`` is not a positive int.
    """
    check_int("num_heads", num_heads)
    if num_heads & (num_heads - 1) == 0:
        return torch.tensor(_power_of_two_slopes(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = _power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(_power_of_two_slopes(closest) + extra)


def alibi_bias(num_heads: int, length_q: int, length_k: int | None = None) -> Tensor:
    """The additive ALiBi bias ``-m_h · |i - j|`` for every head, query and key: ``(num_heads, Lq, Lk)``.

    Queries are aligned with the *last* ``length_q`` keys (query ``i`` sits at position
    ``i + length_k - length_q``), as in self-attention (``Lq = Lk``) and in a KV-cached decoding step, whose
    new queries are the newest positions. The bias is symmetric in distance; a causal mask (applied
    separately) removes the keys after each query, which leaves the paper's ``-m·(i - j)`` for ``j <= i``.

    Add it to the scores before the softmax, e.g. ``scores + alibi_bias(H, L)`` for scores ``(B, H, L, L)``.
    """
    check_int("num_heads", num_heads)
    check_int("length_q", length_q)
    length_k = length_q if length_k is None else length_k
    check_int("length_k", length_k)
    query_positions = torch.arange(length_q) + (length_k - length_q)  # (Lq,)
    key_positions = torch.arange(length_k)  # (Lk,)
    return alibi_bias_at(alibi_slopes(num_heads), query_positions, key_positions)


def alibi_bias_at(slopes: Tensor, query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """``-slopes[h] · |q_i - k_j|`` for explicit positions: ``(H,)``, ``(Lq,)``, ``(Lk,)`` -> ``(H, Lq, Lk)``."""
    distance = (query_positions[:, None] - key_positions[None, :]).abs().to(slopes.dtype)  # (Lq, Lk)
    return -slopes[:, None, None] * distance
