"""Two tasks with one rule, for length extrapolation (chapter 14): output the most recent signal token.

Sequences mix ``SIGNALS`` signal tokens (ids ``0 .. SIGNALS - 1``) with noise tokens (ids ``SIGNALS ..
VOCAB - 1``). At every position the target is the latest signal at or before it (:data:`IGNORE_INDEX` before
the first signal). The rule is the same at every position and every length; the two samplers differ only in
how far back the answer lies:

- :func:`recent_signal_batch`: every position is a signal with probability ``signal_rate`` (1/4), so the
  answer is almost always a few tokens back. A **recency prior**, a model that looks only at the last few
  tokens, solves it; doing well on it at long lengths shows little about using a long context.
- :func:`far_signal_batch`: one signal, among the first ``first`` positions, then noise only. Later positions
  must find an answer that lies far back; a recency prior scores chance (``1 / SIGNALS``) there. This is the
  control for the first task.

:func:`answer_distance` says how far back each answer lies, so that a test can score only the positions whose
answer is further back than any training sequence could hold; :func:`recency_baseline` is the recency prior
itself, as a rule that needs no training.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attention_course.checks import check_int
from attention_course.tasks.positions import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "SIGNALS", "VOCAB", "SignalBatch", "answer_distance", "far_signal_batch",
           "latest_signal_targets", "recency_baseline", "recent_signal_batch"]

#: Signal tokens are ids ``0 .. SIGNALS - 1``; noise tokens the ids from ``SIGNALS`` to ``VOCAB - 1``.
SIGNALS = 8
VOCAB = 16


class SignalBatch(NamedTuple):
    """``tokens (B, L)`` and ``targets (B, L)``: the latest signal at or before each position."""

    tokens: Tensor
    targets: Tensor


def _latest_index(tokens: Tensor) -> Tensor:
    """``(B, L)`` index of the latest signal at or before each position, -1 where there is none yet."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be an int64 tensor of shape (batch, length), got "
                         f"{getattr(tokens, 'dtype', type(tokens))} {tuple(getattr(tokens, 'shape', ()))}")
    positions = torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)
    where = torch.where(tokens < SIGNALS, positions, -1)
    return torch.cummax(where, dim=1).values


def latest_signal_targets(tokens: Tensor) -> Tensor:
    """``tokens (B, L)`` -> ``targets (B, L)``: the latest signal at or before each position (the rule)."""
    latest = _latest_index(tokens)
    return torch.where(latest >= 0, tokens.gather(1, latest.clamp(min=0)), IGNORE_INDEX)


def answer_distance(tokens: Tensor) -> Tensor:
    """``(B, L)``: how many positions back each target's signal lies (0: the position itself; -1: none yet)."""
    latest = _latest_index(tokens)
    positions = torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)
    return torch.where(latest >= 0, positions - latest, -1)


def recent_signal_batch(batch: int, length: int, generator: torch.Generator | None = None,
                        signal_rate: float = 0.25) -> SignalBatch:
    """Each position a signal with probability ``signal_rate``: answers lie a few tokens back.

    Raises:
        ValueError: ``batch`` or ``length`` below 1, or ``signal_rate`` outside ``(0, 1]``.
    """
    check_int("batch", batch, 1)
    check_int("length", length, 1)
    if not 0 < signal_rate <= 1:
        raise ValueError(f"signal_rate must be in (0, 1], got {signal_rate!r}")
    is_signal = torch.rand(batch, length, generator=generator) < signal_rate
    signal = torch.randint(0, SIGNALS, (batch, length), generator=generator)
    noise = torch.randint(SIGNALS, VOCAB, (batch, length), generator=generator)
    tokens = torch.where(is_signal, signal, noise)
    return SignalBatch(tokens, latest_signal_targets(tokens))


def far_signal_batch(batch: int, length: int, generator: torch.Generator | None = None,
                     first: int = 4) -> SignalBatch:
    """One signal at a random position among the first ``first``, noise after it: answers lie far back.

    Raises:
        ValueError: ``batch`` below 1, ``first`` below 1, or ``length`` below ``first``.
    """
    check_int("batch", batch, 1)
    check_int("first", first, 1)
    check_int("length", length, first)
    tokens = torch.randint(SIGNALS, VOCAB, (batch, length), generator=generator)
    where = torch.randint(0, first, (batch,), generator=generator)
    tokens[torch.arange(batch), where] = torch.randint(0, SIGNALS, (batch,), generator=generator)
    return SignalBatch(tokens, latest_signal_targets(tokens))


def recency_baseline(tokens: Tensor, window: int) -> Tensor:
    """The recency prior as a rule: ``(B, L)`` predictions from the last ``window`` tokens only.

    Predicts the latest signal within the last ``window`` positions (the position itself included), and
    signal 0 where the window holds none, so it scores chance, ``1 / SIGNALS``, on answers further back.
    """
    check_int("window", window, 1)
    distance = answer_distance(tokens)
    targets = latest_signal_targets(tokens)
    seen = (distance >= 0) & (distance < window)
    return torch.where(seen, targets, 0)
