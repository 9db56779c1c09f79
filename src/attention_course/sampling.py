"""Choosing the next token from a language model's logits: greedy, temperature, top-k and top-p (chapter 13).

A language model gives, at each step, logits ``z`` over the vocabulary. Decoding turns them into one token:

- **greedy** (``temperature=0``): the most likely token, ``argmax z``; deterministic and often repetitive;
- **temperature** τ: sample from ``softmax(z / τ)``; τ < 1 sharpens the distribution, τ > 1 flattens it;
- **top-k**: keep the k largest logits, renormalise over them, sample;
- **top-p** (nucleus sampling, Holtzman et al. 2020): keep the smallest set of most likely tokens whose
  probabilities add up to at least p (the token that crosses p is kept), renormalise, sample.

Filters act on the *logits* (setting the dropped ones to ``-inf``), after the temperature and before the one
softmax that sampling needs, so the kept tokens keep their relative probabilities.

:func:`chi_square_p_value` tests a sampler: whether the counts of many draws fit the distribution it should
draw from (the grader's check of a learner's sampler, and chapter 17's check of speculative sampling).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["chi_square_p_value", "sample_next_token", "temperature_probabilities", "top_k_filter",
           "top_p_filter"]

# Cells expected fewer draws than this are pooled into one before the chi-square test: Pearson's
# statistic follows its chi-square law only when every cell expects a handful of draws.
_MIN_EXPECTED = 5.0


def _check_logits(logits: object) -> None:
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() < 1 or logits.size(-1) < 1:
        raise ValueError(f"logits must have shape (..., vocab_size) with vocab_size >= 1, got {tuple(logits.shape)}")


def _check_top_k(top_k: object) -> None:
    check_int("top_k", top_k)


def _check_top_p(top_p: object) -> None:
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")


def top_k_filter(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of each row, set the others to ``-inf``.

    Args:
        logits: ``(..., V)``.
        top_k: how many tokens to keep (at least 1; values above V keep everything).

    Returns:
        ``(..., V)``: the same logits where kept, ``-inf`` elsewhere. Ties at the k-th value are all kept.
    """
    _check_logits(logits)
    _check_top_k(top_k)
    if top_k >= logits.size(-1):
        return logits
    kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, -math.inf)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p`` (nucleus sampling).

    Tokens are sorted by probability; a token is kept when the probability of the tokens *before* it is
    still below ``top_p``. So the most likely token is always kept, and so is the token whose probability
    makes the running sum cross ``top_p``.

    Args:
        logits: ``(..., V)``.
        top_p: in (0, 1]; 1 keeps every token.

    Returns:
        ``(..., V)``: the same logits where kept, ``-inf`` elsewhere.
    """
    _check_logits(logits)
    _check_top_p(top_p)
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    probs = torch.softmax(sorted_logits.double(), dim=-1)  # float64: the running sums are compared with p
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the strictly more likely tokens
    drop_sorted = mass_before >= top_p  # the first token has mass_before = 0 < p: always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, -math.inf)


def temperature_probabilities(logits: Tensor, temperature: float) -> Tensor:
    """``softmax(logits / temperature)`` over the last dimension (``temperature > 0``): ``(..., V) -> (..., V)``."""
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(f"temperature must be a positive number here, got {temperature!r}")
    return torch.softmax(logits / temperature, dim=-1)


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token id per row of logits.

    The order is: divide by the temperature, drop tokens outside the top k, drop tokens outside the nucleus
    top p (both on the tempered logits), then sample from the softmax of what is left. ``temperature=0``
    means greedy: the argmax, with no randomness (``top_k`` and ``top_p`` cannot change it).

    Args:
        logits: ``(..., V)`` floating-point scores over a vocabulary of V tokens.
        temperature: ≥ 0. 1 samples from the model's own distribution.
        top_k: None or ≥ 1: keep only the k most likely tokens.
        top_p: None or in (0, 1]: keep the smallest set of most likely tokens with probability ≥ p.
        generator: the random source for the draw (for reproducible samples).

    Returns:
        ``(...)`` int64 token ids.

    Raises:
        TypeError: ``logits`` is not a tensor.
        ValueError: non-floating logits, a negative temperature, ``top_k < 1``, ``top_p`` outside (0, 1].
    """
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature  # temperature on the logits, not on the probabilities
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.float(), dim=-1)  # (..., V); dropped tokens have probability 0
    flat = probs.reshape(-1, probs.size(-1))  # multinomial takes (N, V)
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def chi_square_p_value(counts: Tensor, expected: Tensor) -> float:
    """Pearson's chi-square goodness-of-fit p-value of observed ``counts`` against ``expected`` counts.

    The statistic is ``sum((counts - expected)^2 / expected)`` over the cells, compared with the chi-square
    law of (cells - 1) degrees of freedom. Cells expected fewer than 5 draws are pooled
    into one first. A small p-value says the draws did not come from the expected distribution: reject
    at a significance fixed in advance. An outcome expected never but drawn gives 0.0.

    Args:
        counts: ``(...)`` how often each outcome was drawn (flattened; non-negative).
        expected: the same shape: each outcome's probability times the number of draws (the same total).

    Returns:
        The p-value in [0, 1]; 1.0 when fewer than two cells remain (nothing to test).

    Raises:
        TypeError: ``counts`` or ``expected`` is not a tensor.
        ValueError: different shapes, negative or non-finite entries, or totals that differ.

    Example:
        >>> chi_square_p_value(torch.tensor([50., 50.]), torch.tensor([50., 50.]))
        1.0
    """
    for name, value in (("counts", counts), ("expected", expected)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if counts.shape != expected.shape:
        raise ValueError(f"counts and expected must have the same shape, got {tuple(counts.shape)} and "
                         f"{tuple(expected.shape)}")
    counts, expected = counts.double().flatten(), expected.double().flatten()
    for name, value in (("counts", counts), ("expected", expected)):
        if not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
            raise ValueError(f"{name} must be finite and non-negative")
    total, total_expected = float(counts.sum()), float(expected.sum())
    if abs(total - total_expected) > 1e-3 * max(total, total_expected, 1.0):
        raise ValueError(f"counts and expected must have the same total, got {total:g} and {total_expected:g}")
    if bool((counts[expected == 0] > 0).any()):
        return 0.0  # an impossible outcome was drawn
    small = expected < _MIN_EXPECTED
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        keep = expected > 0
        counts, expected = counts[keep], expected[keep]
    if expected.numel() < 2:
        return 1.0
    statistic = float(((counts - expected) ** 2 / expected).sum())
    freedom = expected.numel() - 1
    # The chi-square survival function: the regularised upper incomplete gamma Q(freedom / 2, statistic / 2).
    return float(torch.special.gammaincc(torch.tensor(freedom / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))
