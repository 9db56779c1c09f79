"""From scores to attention weights: hard (one-hot argmax) and soft (softmax with inverse temperature).

Chapter 2 builds these step by step. An attention output is a weighted combination of value vectors,
``h = a @ X``, and the weights ``a`` must lie on the probability simplex: every entry non-negative, the
entries summing to one. Hard attention picks one item; soft attention spreads the weight, and turns into
hard attention as the inverse temperature ``beta`` grows, provided the largest score is unique (with a tie
it tends to equal weights on the tied maxima).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["hard_attention_weights", "soft_attention_weights", "attention_pool"]


def _check_scores(scores: Tensor, dim: int) -> None:
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be floating point, got dtype {scores.dtype}")
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension (one score per item), got a scalar")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim {dim} is out of range for scores of shape {tuple(scores.shape)}")


def hard_attention_weights(scores: Tensor, dim: int = -1) -> Tensor:
    """One-hot weights on the highest score along ``dim`` (ties go to the first maximum).

    Args:
        scores: ``(..., n)`` scores, one per item.

    Returns:
        ``(..., n)`` weights with exactly one 1 per slice along ``dim`` and 0 elsewhere.
    """
    _check_scores(scores, dim)
    winner = scores.argmax(dim=dim, keepdim=True)
    return torch.zeros_like(scores).scatter_(dim, winner, 1.0)


def soft_attention_weights(scores: Tensor, beta: float = 1.0, dim: int = -1) -> Tensor:
    """Softmax of ``beta * scores`` along ``dim``: the soft(arg)max with inverse temperature ``beta``.

    ``beta = 0`` gives uniform weights. As ``beta`` grows the weights approach
    :func:`hard_attention_weights` when the maximum is unique; when ``m`` scores tie for the maximum they
    approach ``1/m`` on each of them (the argmax picks only the first). Subtracting the maximum before
    exponentiating changes nothing mathematically and keeps ``exp`` from overflowing.

    Args:
        scores: ``(..., n)`` scores.
        beta: inverse temperature, ``beta >= 0``.

    Returns:
        ``(..., n)`` non-negative weights summing to one along ``dim``.
    """
    _check_scores(scores, dim)
    beta = float(beta)
    if not beta >= 0.0 or beta == float("inf"):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    scaled = beta * scores
    shifted = scaled - scaled.amax(dim=dim, keepdim=True)
    exponentials = shifted.exp()
    return exponentials / exponentials.sum(dim=dim, keepdim=True)


def attention_pool(values: Tensor, weights: Tensor) -> Tensor:
    """Weighted combination of value rows: ``output = weights @ values``.

    Args:
        values: ``(..., n, d)``, one item per row.
        weights: ``(..., m, n)`` (``m`` queries) or ``(..., n)`` for a single query.

    Returns:
        ``(..., m, d)``, or ``(..., d)`` for a single query.
    """
    if values.dim() < 2:
        raise ValueError(f"values must be (..., n, d) with one item per row, got shape {tuple(values.shape)}")
    if weights.shape[-1] != values.shape[-2]:
        raise ValueError(
            f"weights have {weights.shape[-1]} entries per query but there are {values.shape[-2]} value rows "
            f"(weights {tuple(weights.shape)}, values {tuple(values.shape)})"
        )
    if weights.dim() == values.dim() - 1:
        return (weights.unsqueeze(-2) @ values).squeeze(-2)
    return weights @ values
